"""``vlrl rollout --extras``: every gym id ``vlrl dataset`` can write rows for, ``vlrl rollout`` can play
(same extras); and pygame-rendered envs print nothing about XDG_RUNTIME_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from vlrl.cli import main

EXTRAS = json.dumps({"keywords": {"left": 0, "right": 1}, "max_turns": 2, "prompt": "Balance the pole."})


def test_rollout_takes_the_extras_dataset_takes(tmp_path, vlrl_model_dir):
    assert (
        main(
            [
                "dataset",
                "--env",
                "gym/CartPole-v1",
                "--extras",
                EXTRAS,
                "--train",
                "1",
                "--eval",
                "1",
                "--out",
                str(tmp_path / "ds"),
            ]
        )
        == 0
    )
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "rollout",
                "--model",
                str(vlrl_model_dir("qwen2_vl")),
                "--env",
                "gym/CartPole-v1",
                "--extras",
                EXTRAS,
                "--rows",
                "1",
                "--max-tokens",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["stop_reason"] in ("done", "max_turns") and 1 <= len(record["turns"]) <= 2
    assert "Balance the pole." in record["messages"][0]["content"][1]["text"]


def test_pygame_rendered_envs_are_quiet():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDL_", "XDG_"))}
    code = (
        "from vlrl.envs import make_env\n"
        "e = make_env('gym/CliffWalking-v1', {}, 0)\n"
        "e.init(None)\n"
        "e.step('<action>up</action>')\n"
        "e.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "XDG_RUNTIME_DIR" not in done.stderr + done.stdout and "pygame" not in done.stdout
