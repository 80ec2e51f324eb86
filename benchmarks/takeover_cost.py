"""What a batch of takeover episodes costs the training process, by phase (``vlrl.envs.maze_sft_data``):

    python benchmarks/takeover_cost.py [--level easy] [--rows 16] [--turns 12] [--model tiny] [--device cpu]
        [--out benchmarks/results/takeover_cost_cpu.json]

On the random-init model (it never stops a reply early, so every policy turn is ``rollout.max_tokens`` long: the
worst case), one batch of ``--rows`` mazes, each phase timed once after a warm-up batch:
- ``prefixes``: the policy's turns, each row capped at its own k + 1 turns (as the curriculum runs them);
- ``prefixes_one_cap``: the same with every row capped at the largest k + 1 (the first farm version, chain_v12);
- ``in_process``: the whole batch built here, the policy's turns and then the expert episodes rendered one after
  another (as steps without the worker farm build it; in chain_v12 call 8 such a step took 31 s on the H200);
- ``expert``: a batch of plain expert episodes of the same rows (what a farm worker renders for a normal step).
Filled by worker processes (``--sft-fill processes``) a takeover step pays ``prefixes`` alone; the rest is a worker's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="easy")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--turns", type=int, default=12, help="M of --takeover N:M")
    ap.add_argument("--model", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/takeover_cost_cpu.json")
    args = ap.parse_args(argv)

    from maze_perception import append_run

    from vlrl.envs import maze_sft_data as data
    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.envs.maze_models import start_checkpoint
    from vlrl.train.run import Run

    weights = start_checkpoint("qwen2_5_vl", args.model, "fan_in", image_stats="maze")
    sets = (f"model.device={args.device}", f"model.path={weights}", f"data.train_rows={4 * args.rows}")
    run = Run(level_config(LevelPlan(args.level, 60, 0, overrides=sets), Path("/tmp/vlrl-takeover-cost")))

    def prefixes_one_cap(rows):  # the first farm version: every row rolled out to the largest k + 1 (no texts kept)
        played = [r for r in rows if data.takeover_turns(r.seed, args.turns)]
        cap = 1 + max((data.takeover_turns(r.seed, args.turns) for r in played), default=0)
        if played:
            run.rollout(played, seed=1, repeats=1, temperature=run.cfg.rollout.eval_temperature, max_turns=cap)

    phases = {
        "prefixes": lambda rows: data.policy_prefixes(run, rows, 1, turns=args.turns),
        "prefixes_one_cap": prefixes_one_cap,
        "in_process": lambda rows: run.collate(data.takeover_episodes(run, rows, 1, turns=args.turns)),
        "expert": lambda rows: run.collate(data.expert_episodes(run, rows, 1, masked=True)),
    }
    data.policy_prefixes(run, run.next_rows(args.rows), 0, turns=args.turns)  # warm-up
    seconds = {}
    for name, phase in phases.items():
        rows = run.next_rows(args.rows)
        t = time.time()
        phase(rows)
        seconds[name] = round(time.time() - t, 2)
        print(name, seconds[name], "s", flush=True)
    run.close()
    entry = {"level": args.level, "rows": args.rows, "turns": args.turns, "model": args.model}
    entry |= {"device": args.device, "seconds": seconds, "date": time.strftime("%Y-%m-%d")}
    append_run(args.out, "takeover batch cost by phase (benchmarks/takeover_cost.py)", entry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
