"""An expert SFT batch built as the farm's workers build it (``vlrl.envs.maze_sft_farm``: the expert's episodes with
their detours masked, then collated), its scripted episodes rendered once (``RolloutConfig.scripts="render_once"``,
``vlrl.rollout.scripted_once``, the default) and per turn (``"per_turn"``, the rollout path).

    python benchmarks/expert_render_once.py [--level easy] [--rows 32] [--rounds 2] [--model small]
        [--out benchmarks/results/expert_render_once_cpu.json]

One thread (as a farm worker), the expert with its detours (``expert_noise`` and ``expert_branch`` 0.15), a warm-up
batch, then ``rounds`` fresh batches each built both ways, each way first in every other round (the renderer's image
cache emptied before each build).
``same`` counts the episodes whose trajectories are equal field for field (ids, masks, tensors, spans, messages);
``replayed`` the episodes the render-once path handed back to the rollout path. Per-batch medians: ``*_episodes_s``
the episodes, ``*_s`` the episodes and their collation; ``per_round_s`` each round's. Collating allocates the
batch's pixel rows afresh (float32, ~1 GB for 32 easy episodes), so its page faults weigh on ``*_s`` by the
allocator's state; ``speedup_episodes`` is the rendering's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class _Worker:
    """What ``expert_episodes`` and ``require_batch`` ask of a run, as the farm's ``_WorkerRun`` (no engine)."""

    def __init__(self, run, scripts: str):
        self.run, self.scripts, self.replayed = run, scripts, 0

    def rollout(self, rows, *, seed: int, repeats: int, script) -> list:
        from vlrl.rollout.generator import RolloutGenerator

        config = dataclasses.replace(
            self.run.rollout_config(seed, repeats=repeats),
            scripts=self.scripts,
            max_context=self.run.engine.max_context,
            progress=False,
        )
        gen = RolloutGenerator(self.run.renderer, None, config)
        trajs = gen.run(rows, script=script)
        self.replayed += gen.replayed
        return trajs

    def collate(self, trajectories):
        return self.run.collate(trajectories)


def _same(a, b) -> int:
    import torch

    def equal(u, v) -> bool:
        return torch.equal(u, v) if isinstance(u, torch.Tensor) else repr(u) == repr(v)  # repr: NaN logprobs

    return sum(all(equal(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x)) for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="easy")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", choices=["tiny", "small"], default="small")
    ap.add_argument("--out", default="benchmarks/results/expert_render_once_cpu.json")
    args = ap.parse_args(argv)

    import torch
    from maze_perception import append_run

    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.envs.maze_models import start_checkpoint
    from vlrl.envs.maze_sft_data import expert_episodes
    from vlrl.train.loop import require_batch
    from vlrl.train.run import Run

    torch.set_num_threads(1)
    weights = start_checkpoint("qwen2_5_vl", args.model, "fan_in", image_stats="maze")
    extras = 'data.extras={"expert_noise":0.15,"expert_branch":0.15}'
    rows_needed = 8 + args.rows * args.rounds
    sets = ("model.device=cpu", f"model.path={weights}", f"data.train_rows={rows_needed}", extras)
    run = Run(level_config(LevelPlan(args.level, 60, 0, overrides=sets), Path("/tmp/vlrl-render-once")))
    workers = {s: _Worker(run, s) for s in ("per_turn", "render_once")}
    expert_episodes(workers["per_turn"], run.next_rows(8), 0, masked=True)  # warm-up
    times: dict[str, list[float]] = {s: [] for s in workers} | {f"{s}_episodes": [] for s in workers}
    same = turns = 0
    for k in range(args.rounds):
        rows = run.next_rows(args.rows)
        built = {}
        for scripts in sorted(workers, reverse=k % 2 == 1):  # each way first in every other round
            worker = workers[scripts]
            run.renderer.forget()
            t = time.time()
            built[scripts] = expert_episodes(worker, rows, 1 + k, masked=True)
            episodes_s = time.time() - t
            require_batch(worker, built[scripts], "benchmark")
            times[scripts].append(time.time() - t)
            times[f"{scripts}_episodes"].append(episodes_s)
            print(scripts, f"episodes {episodes_s:.2f} s, batch {times[scripts][-1]:.2f} s", file=sys.stderr)
        same += _same(built["per_turn"], built["render_once"])
        turns += sum(len(t.turns) for t in built["per_turn"])
    run.close()
    entry = {"level": args.level, "rows": args.rows, "rounds": args.rounds, "model": args.model, "turns": turns}
    entry |= {"same": same, "episodes": args.rows * args.rounds, "replayed": workers["render_once"].replayed}
    entry |= {f"{s}_s": round(statistics.median(v), 2) for s, v in times.items()}
    entry["per_round_s"] = {s: [round(x, 2) for x in v] for s, v in times.items()}  # the order alternates by round
    for what in ("", "_episodes"):
        ratio = statistics.median(times[f"per_turn{what}"]) / statistics.median(times[f"render_once{what}"])
        entry[f"speedup{what}"] = round(ratio, 2)
    entry |= {"date": time.strftime("%Y-%m-%d")}
    print(json.dumps(entry))
    append_run(args.out, "an expert batch rendered per turn and once (expert_render_once.py)", entry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
