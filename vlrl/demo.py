"""``vlrl demo``: the main job until the trainer lands.

Builds (once, cached) the tiny checkpoints, plays a few env episodes through the embedded
renderer and engine — the conversation re-rendered every turn — checks that the engine's
logprobs equal a separate full forward over each turn's prompt + completion, and writes a
self-contained HTML report (frames, actions, rewards, agreement) to ``reports/demo.html``.
"""

from __future__ import annotations

import argparse
import html
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vlrl.models.archs import ARCHS

if TYPE_CHECKING:  # the embedded engine, not any Engine: the agreement check reads its in-process model
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.render.types import Renderer

EPISODES = (("color_square", 1), ("maze2d/easy", 4), ("geometry", 2))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="qwen2_5_vl", choices=ARCHS, help="tiny model architecture")
    parser.add_argument("--seed", type=int, default=0, help="env and sampling seed")
    parser.add_argument("--out", default="reports/demo.html", help="report path")


def run(args: argparse.Namespace) -> int:
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer

    t0 = time.time()
    path = cached_model_dir(args.arch, "tiny")
    renderer, engine = EmbeddedRenderer.from_pretrained(path), EmbeddedEngine.from_pretrained(path)
    episodes = [play(renderer, engine, name, turns, args.seed) for name, turns in EPISODES]
    worst = max(t["max_abs_diff"] for e in episodes for t in e["turns"])
    summary = {
        "model": str(path),
        "arch": args.arch,
        "episodes": len(episodes),
        "max_logprob_abs_diff": worst,
        "seconds": round(time.time() - t0, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_html(summary, episodes))
    print(json.dumps({**summary, "report": str(out)}))
    return 0 if worst <= 1e-4 else 1


def play(renderer: Renderer, engine: EmbeddedEngine, env_class: str, max_turns: int, seed: int) -> dict:
    """One episode, at most ``max_turns`` turns, with a per-turn logprob agreement check."""
    from vlrl.engines.types import SamplingParams
    from vlrl.envs import make_env

    env = make_env(env_class, {}, seed=seed)
    messages, _ = env.init(None)
    turns = []
    for k in range(max_turns):
        prompt = renderer.render(messages)
        gen = engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=24, seed=seed + k))[0]
        result = env.step(gen.text)
        turns.append(
            {
                "images": _image_urls(messages[-1]),
                "prompt_tokens": len(prompt),
                "text": gen.text,
                "tokens": len(gen.token_ids),
                "finish": gen.finish_reason,
                "reward": result.reward,
                "max_abs_diff": agreement(engine.model, prompt, gen),
            }
        )
        messages = messages + [{"role": "assistant", "content": gen.text}] + list(result.observations)
        if result.done:
            break
    env.close()
    return {"env": env_class, "turns": turns, "return": sum(t["reward"] for t in turns)}


def agreement(model, prompt, gen) -> float:
    """max |engine logprob − full-forward logprob| over the generated tokens (fp32, T = 1)."""
    import torch

    from vlrl.checks.logprobs import full_forward_logprobs

    ref = full_forward_logprobs(model, prompt, gen.token_ids, 1.0)
    return float((ref - torch.tensor(gen.logprobs)).abs().max())


def _image_urls(message: dict) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [p["image_url"]["url"] for p in content if p.get("type") == "image_url"]


def report_html(summary: dict, episodes: list[dict]) -> str:
    rows = []
    for ep in episodes:
        rows.append(
            f"<h2>{html.escape(ep['env'])} — return {ep['return']:.2f}</h2><table>"
            "<tr><th>turn</th><th>observation</th><th>generated</th><th>reward</th><th>max |Δ logprob|</th></tr>"
        )
        for k, t in enumerate(ep["turns"]):
            imgs = "".join(f'<img src="{u}" height="96">' for u in t["images"])
            rows.append(
                f"<tr><td>{k + 1}</td><td>{imgs}<br>{t['prompt_tokens']} prompt tokens</td>"
                f"<td><code>{html.escape(t['text'])}</code><br>{t['tokens']} tokens, {t['finish']}</td>"
                f"<td>{t['reward']:.2f}</td><td>{t['max_abs_diff']:.2e}</td></tr>"
            )
        rows.append("</table>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>vlrl demo</title><style>"
        "body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
        "table{border-collapse:collapse}code{white-space:pre-wrap}</style></head><body>"
        f"<h1>vlrl demo</h1><pre>{html.escape(json.dumps(summary, indent=2))}</pre>{''.join(rows)}</body></html>"
    )
