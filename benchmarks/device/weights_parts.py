"""Move a model directory from one device lease to the next, in parts that fit the device tool's limits.

Why: the maze curriculum's ``small`` model is 174 MB in fp32, and a lease ends after 30 minutes. A call brings back
at most 64 MiB (8 files of 16 MiB) and carries 64 MiB with the working tree, so without this every lease redoes
5x5 → 7x7 (~500 s of its ~1,800) before it can train easy again. ``pack`` rounds the fp32 tensors to bf16 (half the
bytes) and splits one tar of the directory into parts; ``unpack`` casts them back to their recorded dtypes. Rounding
moves a weight by at most 2^-8 of itself; the optimizer state does not travel (each level builds a fresh AdamW
anyway), so a continued run starts from the rounded weights with a fresh optimizer, as every level does.

With each safetensors file's even and odd bytes apart (:func:`_split`) the small model packs into 61.1 MiB (68.5 as
is): 4 parts of at most 15.75 MiB, so they and the call's small files come back with the call that trained::

    python3 benchmarks/device/weights_parts.py pack /tmp/mc/easy/weights /tmp/wp && cp /tmp/wp/part.0[0-3] $OUT/

(a pack of 5 parts: a next call ``cp /tmp/wp/part.0[4-9] $OUT/`` for the rest). Here: put the returned parts under
``.gpuwork/NAME/p1/`` and regroup them with ``bash benchmarks/device/carry_parts.sh .gpuwork/NAME .gpuwork/NAME_c``
(one group a call); on the device, after the last group::

    python3 benchmarks/device/weights_parts.py unpack /tmp/wparts /tmp/w && <command> --weights /tmp/w
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
import zlib
from pathlib import Path

import torch
from safetensors.torch import load, save

MANIFEST = "weights_parts.json"
CAST_FROM = {torch.float32: "float32"}
PART_MIB = 15.75
"""A call brings back 8 files of up to 16 MiB, 64 MiB in all: 4 parts leave ~1 MiB for its logs."""


def pack(src: Path, dst: Path, part_mib: float = PART_MIB) -> list[Path]:
    """``src``'s files as one tar split into ``dst/part.NN`` of at most ``part_mib`` MiB; fp32 tensors as bf16."""
    buf, manifest = io.BytesIO(), {"cast": {}, "sha256": {}, "split": {}}
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:  # tokenizer.json: 18.6 MB of JSON
        for f in sorted(p for p in src.iterdir() if p.is_file()):
            data = f.read_bytes()
            if f.suffix == ".safetensors":
                tensors = load(data)
                cast = {k: CAST_FROM[t.dtype] for k, t in tensors.items() if t.dtype in CAST_FROM}
                data = save({k: t.to(torch.bfloat16) if k in cast else t for k, t in tensors.items()})
                manifest["cast"][f.name] = cast
            manifest["sha256"][f.name] = hashlib.sha256(data).hexdigest()
            if f.suffix == ".safetensors":
                data, manifest["split"][f.name] = _split(data)
            _add(tar, f.name, data)
        _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    dst.mkdir(parents=True, exist_ok=True)
    blob, size = buf.getvalue(), int(part_mib * 2**20)
    parts = []
    for i in range(0, len(blob), size):
        parts.append(dst / f"part.{i // size:02d}")
        parts[-1].write_bytes(blob[i : i + size])
    return parts


def unpack(src: Path, dst: Path) -> Path:
    """The parts in ``src`` (``part.NN``, all of them) back into the model directory ``dst``."""
    parts = sorted(src.glob("part.*"))
    if not parts:
        raise FileNotFoundError(f"no part.NN files in {src}")
    blob = b"".join(p.read_bytes() for p in parts)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        manifest = json.loads(files.pop(MANIFEST))
    except (tarfile.TarError, EOFError, zlib.error, KeyError) as e:
        names = ", ".join(p.name for p in parts)
        raise ValueError(f"{src}: parts {names} do not make a whole pack (one missing or cut short?): {e}") from e
    dst.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if name in manifest.get("split", {}):
            data = _join(data, manifest["split"][name])
        if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
            raise ValueError(f"{name}: checksum differs from the packed file (parts out of order or altered)")
        cast = manifest["cast"].get(name)
        if cast:
            tensors = {k: t.to(getattr(torch, cast[k])) if k in cast else t for k, t in load(data).items()}
            data = save(tensors, {"format": "pt"})  # the metadata transformers checks for
        (dst / name).write_bytes(data)
    return dst


def _split(data: bytes) -> tuple[bytes, int]:
    """A safetensors file with its tensor bytes' even and odd bytes apart (the header first, unchanged). A bf16's
    high byte (sign, exponent) takes few values and compresses ~2.5x, its low byte (mantissa) barely; interleaved, gzip
    found little of it (the small model: 69.0 MB gzipped as is, 60.7 MB apart). Returns the bytes and the header's
    length."""
    head = 8 + int.from_bytes(data[:8], "little")
    body = data[head:]
    if len(body) % 2:
        return data, len(data)  # not all 2-byte tensors: nothing to gain, kept as is
    return data[:head] + body[0::2] + body[1::2], head


def _join(data: bytes, head: int) -> bytes:
    """:func:`_split` undone."""
    body, half = bytearray(len(data) - head), (len(data) - head) // 2
    body[0::2], body[1::2] = data[head : head + half], data[head + half :]
    return data[:head] + bytes(body)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="model directory -> parts")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--part-mib", type=float, default=PART_MIB)
    u = sub.add_parser("unpack", help="parts -> model directory")
    u.add_argument("src", type=Path)
    u.add_argument("dst", type=Path)
    args = ap.parse_args()
    if args.cmd == "pack":
        parts = pack(args.src, args.dst, args.part_mib)
        print(f"{len(parts)} parts, {sum(q.stat().st_size for q in parts) / 2**20:.1f} MiB, under {args.dst}")
    else:
        print(f"unpacked into {unpack(args.src, args.dst)}")


if __name__ == "__main__":
    main()
