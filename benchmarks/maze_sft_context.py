"""Whether the maze expert's SFT episodes fit the model's context: per level and expert setting, the first N
training mazes' expert episodes (the curriculum's ``DetourRecorder``, as an SFT batch builds them) at the model's
own context and with none, their stop reasons, turns and tokens (docs/maze.md item 30).

    python benchmarks/maze_sft_context.py WEIGHTS [--rows 64] [--json benchmarks/results/maze_sft_context_cpu.json]

WEIGHTS: a model directory (its renderer sets the tokens a turn; the weights are not used: the expert plays).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SETTINGS = [  # (level, expert_noise, expert_branch, max_turns or None: the level's)
    *[("hard", noise, branch, None) for noise, branch in ((0.15, 0.15), (0.15, 0.0), (0.0, 0.15), (0.0, 0.0))],
    *[("hard", 0.15, 0.15, turns) for turns in (34, 35, 36)],
    ("easy", 0.15, 0.15, None),
    ("7x7", 0.15, 0.15, None),
]


def measure(weights: str, level: str, noise: float, branch: float, turns: int | None, rows: int) -> list[dict]:
    """The episodes' figures at the model's context and with none (``run.engine.max_context`` 10**6)."""
    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.envs.maze_sft_data import DetourRecorder
    from vlrl.train.run import Run

    extras = {"expert_noise": noise, "expert_branch": branch} | ({"max_turns": turns} if turns else {})
    sets = ("model.device=cpu", f"model.path={weights}", f"data.train_rows={rows}", "data.eval_rows=4")
    sets += (f"data.extras={json.dumps(extras)}", "run.seed=34")
    run = Run(level_config(LevelPlan(level, 0, 0, overrides=sets), "/tmp/maze_sft_context"))
    out = []
    try:
        for context in (run.engine.max_context, 10**6):
            run.engine.max_context = context
            trajs = run.rollout(run.train_rows[:rows], seed=1, repeats=1, script=DetourRecorder())
            n_turns = sorted(len(t.turns) for t in trajs)
            tokens = sorted(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
            out.append(
                {"level": level, "extras": extras, "context": context}
                | {"stop_reasons": dict(collections.Counter(t.stop_reason for t in trajs))}
                | {"turns_median": n_turns[len(n_turns) // 2], "turns_max": n_turns[-1]}
                | {"tokens_median": tokens[len(tokens) // 2], "tokens_max": tokens[-1]}
            )
            print(out[-1], flush=True)
    finally:
        run.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--json", default="benchmarks/results/maze_sft_context_cpu.json")
    args = ap.parse_args(argv)
    runs = [r for s in SETTINGS for r in measure(args.weights, *s, args.rows)]
    command = "python benchmarks/maze_sft_context.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.json).write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
