"""A full GRPO step's time split (rollout, weight sync, train) from a real training run, as bench JSON.

Runs ``vlrl train RECIPE run.out=DIR [overrides]`` (the trainer's own loop: SFT, then RL steps with the engine the
overrides choose; stopped after ``LIMIT`` seconds if set, the steps done kept), then reads what the run logged:
per RL step ``time_rollout_s`` / ``time_train_s`` / ``time_sync_s`` and the step's wall time (``metrics.jsonl``),
each sync's route, seconds and probe (``weight_sync.jsonl``), and each step's agreement (``agreement.jsonl``).
The 2b model on vLLM, one GPU:

    python benchmarks/grpo_step_split.py OUT.json maze2d model.size=2b rollout.engine=vllm run.agreement=stop \\
        sft.steps=1 sft.rows_per_step=8 run.steps=3 rollout.rows_per_step=8 data.eval_rows=8 run.eval_every=0 \\
        'data.extras={"max_turns":8}'
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vlrl.bench.env import device_name, git_commit, versions


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def split(run: Path) -> list[dict]:
    """One row per RL step: the three parts, the step's wall time and what the parts leave out."""
    metrics = read_jsonl(run / "metrics.jsonl")
    agreement = {a["step"]: a for a in read_jsonl(run / "agreement.jsonl")}
    rows, prev = [], None
    for m in metrics:
        if m.get("phase") == "rl":
            parts = {k: round(m[k], 3) for k in ("time_rollout_s", "time_sync_s", "time_train_s") if k in m}
            row: dict = {"step": m["step"], **parts}
            if prev is not None:
                row["step_wall_s"] = round(m["time"] - prev, 3)
                row["other_s"] = round(row["step_wall_s"] - sum(parts.values()), 3)
            a = agreement.get(m["step"])
            if a:
                row["agreement"] = {k: a[k] for k in ("max_abs", "mean_abs", "bound", "breached")}
            rows.append(row)
        prev = m.get("time", prev)
    return rows


def main() -> None:
    out, recipe, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    run = Path(tempfile.mkdtemp(prefix="grpo_split_"))
    cmd = [sys.executable, "-m", "vlrl.cli", "train", recipe, f"run.out={run}", "run.progress=False", *overrides]
    t0 = time.perf_counter()
    limit = float(os.environ.get("LIMIT", "0")) or None  # a device command's clock: keep the steps that finished
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        proc = subprocess.CompletedProcess(cmd, -9, "", err + f"\n(stopped at LIMIT={limit:.0f} s)")
    import torch

    result = {
        "command": " ".join(["vlrl", "train", recipe, *overrides]),
        "returncode": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "device": device_name("cuda" if torch.cuda.is_available() else "cpu"),
        "versions": versions(),
        "commit": git_commit(),  # the .clean copies on the device host: set $VLRL_BENCH_COMMIT
        "steps": split(run),
        "syncs": read_jsonl(run / "weight_sync.jsonl"),
        "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
    }
    Path(out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["steps"]), proc.stderr[-800:] if proc.returncode else "")


if __name__ == "__main__":
    main()
