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
from typing import Any

from vlrl.errors import VlrlError
from vlrl.golden.scenarios import SCENARIOS, ScriptedEpisode, register_scenario_envs
from vlrl.render.types import Renderer
from vlrl.rollout.types import Trajectory

HEADER_END = "---"


def golden_path(root: str | Path, arch: str, scenario: str) -> Path:
    return Path(root) / arch / f"{scenario}.golden"


def play(scenario: ScriptedEpisode, renderer: Renderer, max_context: int, tokenizer: Any = None) -> Trajectory:
    """The scenario's scripted episode through ``renderer`` (no engine: the script is the policy), in a
    context of ``max_context`` tokens (the model's; a scenario may set a smaller one)."""
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

    register_scenario_envs()
    cfg = RolloutConfig(
        sampling=scenario.sampling,
        max_turns=scenario.max_turns,
        max_context=scenario.max_context or max_context,
        progress=False,
    )
    gen = RolloutGenerator(renderer, None, cfg, tokenizer=tokenizer)
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


BUILTIN_REGEN_LINE = "# Regenerate with `vlrl golden regen`; read the diff before committing."


def format_golden(traj, tokenizer, arch: str, scenario: ScriptedEpisode, regen_line: str = BUILTIN_REGEN_LINE) -> str:
    """The golden text of ``traj`` (deterministic: same trajectory, same bytes); ``regen_line``: the header's
    second line, the command that rewrites the file."""
    pad_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    masked = sum(traj.loss_mask)
    head = [
        f"# vlrl golden file: {arch} / {scenario.name} — {scenario.description}",
        regen_line,
        f"arch: {arch}",
        f"scenario: {scenario.name}",
        f"stop_reason: {traj.stop_reason}",
        f"tokens: {len(traj.token_ids)} (prompt {len(traj.prompt_ids)}, response {len(traj.response_ids)}, "
        f"generated {masked})",
    ]
    grids = traj.image_grid_thw.tolist() if traj.image_grid_thw is not None else []
    for k, (ph, grid, sha) in enumerate(zip(traj.placeholders, grids, traj.image_hashes)):
        head.append(f"image {k}: grid {grid}, pads [{ph.offset}, {ph.offset + ph.length}), sha256 {sha[:16]}")
    for s in traj.turns:
        end = "appended" if s.eos_appended else "generated"
        head.append(
            f"turn {s.index}: observation [{s.obs_start}, {s.gen_start}), reply [{s.gen_start}, {s.gen_end}), "
            f"reward {s.reward:g}, finish {s.finish_reason}, end of turn {end}, images before {s.images_before}"
        )
    return "\n".join(head + [HEADER_END] + _token_rows(traj, tokenizer, pad_id)) + "\n"


@dataclass(frozen=True)
class Parsed:
    header: list[str]
    tokens: list[tuple[str, int, str]]
    """``(mask, id, text)`` per token, pad runs expanded."""


class GoldenFormatError(VlrlError, ValueError):
    """A golden file that is corrupt or truncated: names its path and line."""

    def __init__(self, path: str | Path | None, line: int, what: str):
        self.path, self.line = path, line
        super().__init__(
            f"{path or 'golden file'}:{line}: {what} "
            "(corrupt or truncated; regenerate it with the command in its second line)"
        )


def parse_golden(text: str, path: str | Path | None = None) -> Parsed:
    """The header lines and the expanded token rows; :class:`GoldenFormatError` names ``path`` and the line."""
    lines = text.splitlines()
    if HEADER_END not in lines:
        raise GoldenFormatError(path, len(lines), f"no '{HEADER_END}' line ending the header")
    cut = lines.index(HEADER_END)
    tokens = []
    for number, line in enumerate(lines[cut + 1 :], start=cut + 2):
        tokens.extend(_token_row(line, path, number))
    _check_count(lines[:cut], len(tokens), path, len(lines))
    return Parsed(lines[:cut], tokens)


def _token_row(line: str, path, number: int) -> list[tuple[str, int, str]]:
    count, body = 1, line
    last = line.rsplit(" ", 1)[-1]
    if last.startswith("x") and last[1:].isdigit():
        body, run = line.rsplit(" ", 1)
        count = int(run[1:])
    fields = body.strip().split(None, 3)
    if len(fields) != 4 or not fields[0].isdigit() or fields[1] not in ("-", "0", "1") or not fields[2].isdigit():
        raise GoldenFormatError(path, number, f"not a token row 'index  mask  id  text': {line[:80]!r}")
    _, mark, tid, tok = fields
    return [(mark, int(tid), tok)] * count


def _check_count(header: list[str], n_tokens: int, path, n_lines: int) -> None:
    declared = next((h for h in header if h.startswith("tokens: ")), None)
    if declared is None:
        return
    try:
        want = int(declared.split()[1])
    except (IndexError, ValueError):
        raise GoldenFormatError(path, header.index(declared) + 1, f"unreadable token count {declared!r}") from None
    if want != n_tokens:
        raise GoldenFormatError(path, n_lines, f"the header declares {want} tokens, the rows hold {n_tokens}")


def golden_diff(expected: str, actual: str, context: int = 4, path: str | Path | None = None) -> str:
    """A token-level report: header changes, first divergence side by side, loss-mask changes.
    ``path``: where ``expected`` was read (named by :class:`GoldenFormatError` if it is corrupt)."""
    a, b = parse_golden(expected, path), parse_golden(actual, "the new rendering")
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
        out.append(
            f"loss-mask changes at {len(masks)} tokens (index golden->now): "
            + ", ".join(f"{i} {x}->{y}" for i, x, y in masks[:20])
            + (" …" if len(masks) > 20 else "")
        )
    return "\n".join(out) if out else "no token or mask difference (whitespace or formatting only)"


def render_scenario(arch: str, scenario: str, renderer: Renderer, max_context: int, tokenizer: Any = None) -> str:
    """The golden text of ``scenario`` played through ``renderer`` (see :func:`play`)."""
    sc = SCENARIOS[scenario]
    tok = tokenizer if tokenizer is not None else renderer.tokenizer
    return format_golden(play(sc, renderer, max_context, tokenizer=tok), tok, arch, sc)
