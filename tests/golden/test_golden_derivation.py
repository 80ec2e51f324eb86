"""Each golden file, derived a second way: without vlrl's renderer, rollout or golden code.

The conversation is replayed by stepping the env with the scripted replies; its text comes from
the chat-template file through plain jinja2; each image's pad count from its pixel size and the
checkpoint's processor config (Qwen's resize rule written out here). The golden's tokens, joined,
must spell exactly that text, its loss mask must cover exactly the replies, and its grids must be
the ones computed here — so a golden cannot drift together with the code that writes it.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import math
import re
from pathlib import Path

import jinja2
import pytest
from PIL import Image

from vlrl.envs import make_env
from vlrl.golden.scenarios import SCENARIOS, register_scenario_envs

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "vlrl" / "models" / "templates" / "chatml_vl.jinja"


def read_golden(path: Path):
    """(header lines, [(mask, text)] per token) — parsed here, not with vlrl's parser."""
    lines = path.read_text(encoding="utf-8").splitlines()
    cut = lines.index("---")
    tokens = []
    for line in lines[cut + 1 :]:
        _, mask, _, rest = line.split(None, 3)
        run = re.fullmatch(r"(.*) x(\d+)", rest)
        text, count = (run.group(1), int(run.group(2))) if run else (rest, 1)
        tokens += [(mask, ast.literal_eval(text))] * count
    return lines[:cut], tokens


def cut_at_stop(text: str, stops) -> tuple[str, bool]:
    hits = [text.find(s) + len(s) for s in stops if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def replay(scenario, n_turns: int):
    """The conversation of the first ``n_turns`` scripted turns, and whether each was cut by a stop string."""
    register_scenario_envs()
    row = scenario.row
    env = make_env(row["env_class"], row["extras"], seed=row["seed"])
    messages, _ = env.init(None)
    messages, cut = list(messages), []
    for k in range(n_turns):
        text, stopped = cut_at_stop(scenario.script[k], scenario.sampling.stop)
        messages.append({"role": "assistant", "content": text})
        cut.append(stopped)
        if k + 1 < n_turns:
            messages += env.step(text).observations
    return messages, cut


def template_text(messages) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    env.filters["tojson"] = json.dumps
    return env.from_string(TEMPLATE.read_text()).render(messages=messages, add_generation_prompt=False)


def resized_grid(width: int, height: int, cfg: dict) -> tuple[int, int]:
    """Qwen-VL's resize: sides to multiples of patch*merge, area within [min, max] pixels."""
    factor = cfg["patch_size"] * cfg["merge_size"]
    lo, hi = cfg["size"]["shortest_edge"], cfg["size"]["longest_edge"]
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h // cfg["patch_size"], w // cfg["patch_size"]


def image_sizes(messages):
    for m in messages:
        for part in m["content"] if isinstance(m["content"], list) else []:
            if part["type"] == "image_url":
                data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                yield Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_golden_is_derivable_independently(vlrl_model_dir, arch, scenario):
    header, tokens = read_golden(ROOT / "golden" / arch / f"{scenario}.golden")
    n_turns = sum(line.startswith("turn ") for line in header)
    messages, cut = replay(SCENARIOS[scenario], n_turns)
    cfg = json.loads((Path(vlrl_model_dir(arch)) / "processor_config.json").read_text())["image_processor"]
    grids = [resized_grid(w, h, cfg) for w, h in image_sizes(messages)]
    # Text: the template's, minus the newline after the last turn, with each pad run expanded.
    pieces = template_text(messages).removesuffix("\n").split("<|image_pad|>")
    want = pieces[0] + "".join(
        "<|image_pad|>" * (gh * gw // cfg["merge_size"] ** 2) + p for (gh, gw), p in zip(grids, pieces[1:])
    )
    assert "".join(t for _, t in tokens) == want
    assert [line.split("grid ")[1].split("]")[0] + "]" for line in header if line.startswith("image ")] == [
        str([1, gh, gw]) for gh, gw in grids
    ]
    # Loss mask: exactly the replies (plus the generated end of turn when no stop string cut them).
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    runs, current = [], None
    for mask, text in tokens:
        if mask == "1":
            current = (current or "") + text
        elif current is not None:
            runs.append(current)
            current = None
    runs += [current] if current is not None else []
    assert runs == [r + ("" if stopped else "<|im_end|>") for r, stopped in zip(replies, cut)]
