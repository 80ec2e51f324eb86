"""Trajectories as JSON lines, for inspection (``vlrl rollout --out FILE.jsonl``).

One object per trajectory with every field of :class:`~vlrl.rollout.types.Trajectory` except the
pixel tensor (its shape and a checksum instead; the images themselves are in ``messages``), plus
the decoded text of every token. NaN logprobs (scripted turns) are written as null.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path


def trajectory_record(traj, tokenizer=None) -> dict:
    rec = {
        f.name: getattr(traj, f.name)
        for f in dataclasses.fields(traj)
        if f.name not in ("pixel_values", "image_grid_thw", "placeholders", "turns")
    }
    rec["logprobs"] = [None if math.isnan(x) else x for x in traj.logprobs]
    rec["image_grid_thw"] = traj.image_grid_thw.tolist() if traj.image_grid_thw is not None else []
    rec["placeholders"] = [dataclasses.asdict(p) for p in traj.placeholders]
    rec["turns"] = [dataclasses.asdict(s) for s in traj.turns]
    if traj.pixel_values is not None:
        pv = traj.pixel_values.float().contiguous()
        rec["pixel_values"] = {"shape": list(pv.shape), "sha256": hashlib.sha256(pv.numpy().tobytes()).hexdigest()}
    if tokenizer is not None:
        rec["tokens"] = [tokenizer.decode([t]) for t in traj.token_ids]
    return rec


def write_jsonl(trajectories, path: str | Path, tokenizer=None) -> Path:
    """Write one record per trajectory; the file appears whole or not at all (written aside, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    with tmp.open("w", encoding="utf-8") as f:
        for traj in trajectories:
            f.write(json.dumps(trajectory_record(traj, tokenizer), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path
