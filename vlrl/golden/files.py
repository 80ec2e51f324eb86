"""Golden files: a trajectory as diffable text, the token-level diff, and playing a scenario.

Layout: ``golden/<arch>/<scenario>.golden``. A header (stop reason, images with grids and pad
ranges, turns with spans) then one line per token — ``index  mask  id  'text'`` where mask is
``-`` for prompt tokens, ``1`` for generated ones and ``0`` for the rest of the response; a run
of image pads is one line ending ``x<count>``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from vlrl.golden.scenarios import SCENARIOS, Scenario, register_scenario_envs

HEADER_END = "---"


def golden_path(root: str | Path, arch: str, scenario: str) -> Path:
    return Path(root) / arch / f"{scenario}.golden"


def play(scenario: Scenario, renderer, engine, tokenizer=None):
    """The scenario's scripted episode through ``renderer`` (any engine supplies only its context size)."""
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

    register_scenario_envs()
    cfg = RolloutConfig(sampling=scenario.sampling, max_turns=scenario.max_turns, max_context=scenario.max_context,
                        progress=False)
    gen = RolloutGenerator(renderer, engine, cfg, tokenizer=tokenizer)
    (traj,) = gen.run([scenario.row], script=lambda env, row: scenario.script)
    return traj


def _token_rows(traj, tokenizer, pad_id: int) -> list[str]:
    ids, n_prompt = traj.token_ids, len(traj.prompt_ids)
    rows, i = [], 0
    while i < len(ids):
        mark = "-" if i < n_prompt else str(traj.loss_mask[i - n_prompt])
        j = i + 1
        if ids[i] == pad_id:
            while j < len(ids) and ids[j] == pad_id:
                j += 1
        text = repr(tokenizer.decode([ids[i]]))
        rows.append(f"{i:>6}  {mark}  {ids[i]:>6}  {text}" + (f" x{j - i}" if j - i > 1 else ""))
        i = j
    return rows


def format_golden(traj, tokenizer, arch: str, scenario: Scenario) -> str:
    """The golden text of ``traj`` (deterministic: same trajectory, same bytes)."""
    pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    masked = sum(traj.loss_mask)
    head = [f"# vlrl golden file: {arch} / {scenario.name} — {scenario.description}",
            "# Regenerate with `vlrl golden regen`; read the diff before committing.",
            f"arch: {arch}", f"scenario: {scenario.name}", f"stop_reason: {traj.stop_reason}",
            f"tokens: {len(traj.token_ids)} (prompt {len(traj.prompt_ids)}, response {len(traj.response_ids)}, "
            f"generated {masked})"]
    grids = traj.image_grid_thw.tolist() if traj.image_grid_thw is not None else []
    for k, (ph, grid, sha) in enumerate(zip(traj.placeholders, grids, traj.image_hashes)):
        head.append(f"image {k}: grid {grid}, pads [{ph.offset}, {ph.offset + ph.length}), sha256 {sha[:16]}")
    for s in traj.turns:
        end = "appended" if s.eos_appended else "generated"
        head.append(f"turn {s.index}: observation [{s.obs_start}, {s.gen_start}), reply [{s.gen_start}, {s.gen_end}), "
                    f"reward {s.reward:g}, finish {s.finish_reason}, end of turn {end}, images before {s.images_before}")
    return "\n".join(head + [HEADER_END] + _token_rows(traj, tokenizer, pad_id)) + "\n"


@dataclass(frozen=True)
class Parsed:
    header: list[str]
    tokens: list[tuple[str, int, str]]
    """``(mask, id, text)`` per token, pad runs expanded."""


def parse_golden(text: str) -> Parsed:
    lines = text.splitlines()
    if HEADER_END not in lines:
        raise ValueError(f"not a golden file: no '{HEADER_END}' line")
    cut = lines.index(HEADER_END)
    tokens = []
    for line in lines[cut + 1:]:
        count = 1
        body = line
        if line.rsplit(" ", 1)[-1].startswith("x") and line.rsplit(" ", 1)[-1][1:].isdigit():
            body, run = line.rsplit(" ", 1)
            count = int(run[1:])
        _, mark, tid, tok = body.strip().split(None, 3)
        tokens.extend([(mark, int(tid), tok)] * count)
    return Parsed(lines[:cut], tokens)


def golden_diff(expected: str, actual: str, context: int = 4) -> str:
    """A token-level report: header changes, first divergence side by side, loss-mask changes."""
    a, b = parse_golden(expected), parse_golden(actual)
    out = []
    head = list(difflib.unified_diff(a.header, b.header, "golden", "now", lineterm="", n=0))
    if head:
        out += ["header:"] + head[2:]
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x[1] != y[1]), None)
    if first is None and len(a.tokens) != len(b.tokens):
        first = min(len(a.tokens), len(b.tokens))
    if first is not None:
        out.append(f"first token divergence at index {first} (golden {len(a.tokens)} tokens, now {len(b.tokens)}):")
        out.append(f"{'index':>6}  {'golden':<36} {'now':<36}")
        for i in range(max(0, first - context), first + context + 1):
            ga = f"{a.tokens[i][0]} {a.tokens[i][1]:>6} {a.tokens[i][2]}" if i < len(a.tokens) else "<end>"
            gb = f"{b.tokens[i][0]} {b.tokens[i][1]:>6} {b.tokens[i][2]}" if i < len(b.tokens) else "<end>"
            out.append(f"{'>' if i == first else ' '}{i:>5}  {ga:<36} {gb:<36}")
    masks = [(i, x[0], y[0]) for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x[1] == y[1] and x[0] != y[0]]
    if masks:
        out.append(f"loss-mask changes at {len(masks)} tokens (index golden->now): "
                   + ", ".join(f"{i} {x}->{y}" for i, x, y in masks[:20]) + (" …" if len(masks) > 20 else ""))
    return "\n".join(out) if out else "no token or mask difference (whitespace or formatting only)"


def render_scenario(arch: str, scenario: str, renderer, engine, tokenizer=None) -> str:
    sc = SCENARIOS[scenario]
    tok = tokenizer if tokenizer is not None else renderer.tokenizer
    return format_golden(play(sc, renderer, engine, tokenizer=tok), tok, arch, sc)
