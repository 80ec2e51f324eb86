"""Scripted episodes rendered once (``vlrl.rollout.scripted_once``) against the rollout path that renders every
turn: the same trajectories field for field, and every episode the one-render path cannot play handed back to
the rollout path (``RolloutGenerator.replayed``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rollout_env import OBS_KINDS, probe_row
from test_rollout_faults import count_images_in_system, renderer_with_template

from vlrl.data.tickets import make_rows
from vlrl.engines.types import SamplingParams
from vlrl.envs.maze_sft_data import DetourRecorder
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.rollout.splice import HistoryRewriteError, PrefixError

MAZE = SamplingParams(max_tokens=12, stop=("</action>",))


def both(renderer, engine, rows, script, *, sampling=MAZE, **config):
    """The trajectories of the rollout path, of the render-once path, and how many episodes it handed back; each
    from a cold engine (a turn left to it would otherwise reuse the first path's cached prefix, which changes its
    logprobs in the last bits)."""
    out = {}
    for scripts in ("per_turn", "render_once"):
        engine.clear_caches()
        cfg = RolloutConfig(sampling=sampling, progress=False, scripts=scripts, **config)
        gen = RolloutGenerator(renderer, engine, cfg)
        out[scripts] = (gen.run(rows, script=script), gen.replayed)
    return out["per_turn"][0], out["render_once"][0], out["render_once"][1]


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, torch.Tensor):
                assert torch.equal(u, v), (x.uid, f.name)
            elif f.name == "logprobs":  # NaN for scripted tokens: compared by their text
                assert list(map(repr, u)) == list(map(repr, v)), x.uid
            else:
                assert u == v, (x.uid, f.name)


def test_maze_expert_episodes_with_detours_are_the_rollout_paths(tiny):
    """The maze expert with its detours (the SFT farm's batches): every episode rendered once, token for token and
    tensor for tensor the rollout path's, including the end of turn appended after the ``</action>`` stop."""
    bundle = tiny("qwen2_5_vl")
    rows = make_rows("maze2d/7x7", list(range(6)), {"expert_noise": 0.3, "expert_branch": 0.3})
    recorders = DetourRecorder(), DetourRecorder()
    per_turn, once, replayed = both(bundle.renderer, bundle.engine, rows, lambda env, row: recorders[0](env, row))
    assert replayed == 0
    assert_same(per_turn, once)
    assert all(t.stop_reason == "done" and len(t.turns) > 3 for t in once)
    assert all(s.eos_appended for t in once for s in t.turns)  # the stop string cut each text: <|im_end|> appended


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_every_observation_kind_is_the_rollout_paths(tiny, probe_env, arch):
    """Images, text, tool messages, two images in a message, two messages a turn; the episode's return on each
    text's length; no stop string (the scripted ids end with the model's own ``<|im_end|>``)."""
    bundle = tiny(arch)
    texts = ["left", "a longer answer, with punctuation!", "up", "  spaced", "ok", "done"]
    rows = [probe_row(OBS_KINDS, seed=1), probe_row(["image", "image"], seed=2), probe_row([], seed=3)]
    per_turn, once, replayed = both(
        bundle.renderer, bundle.engine, rows, lambda env, row: texts, sampling=SamplingParams(max_tokens=16)
    )
    assert replayed == 0
    assert_same(per_turn, once)
    assert [len(t.turns) for t in once] == [len(OBS_KINDS) + 1, 3, 1]


def _script(texts):
    return lambda env, row: list(texts)


CASES = {
    "a turn left to the engine": (_script(["left", None, "up"]), {"kinds": ["text", "text"]}, "done"),
    "a text over max_tokens": (_script(["left " * 20, "up"]), {"kinds": ["text"]}, "done"),
    "a text that starts with a newline": (_script(["\nleft", "up"]), {"kinds": ["text"]}, "done"),
    "an env that raises": (_script(["left", "up", "right"]), {"kinds": ["text", "text"], "raise_at": 1}, "env_error"),
    "a broken image": (
        _script(["left", "up", "right"]),
        {"kinds": ["image", "image"], "broken_image_at": 1},
        "env_error",
    ),
    "a script that runs out": (_script(["left"]), {"kinds": ["text", "text"]}, "engine_error"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_one_render_cannot_play_goes_the_rollout_path(tiny, probe_env, case):
    """Each such episode is handed back and played per turn: the trajectory is the rollout path's, ending as it
    does; the other episode of the batch stays rendered once."""
    bundle = tiny("qwen2_5_vl")
    script, extras, stop = CASES[case]
    rows = [probe_row(seed=4, **extras), probe_row(["image"], seed=5)]

    def play(env, row):
        return script(env, row) if row["seed"] == 4 else ["fine", "fine"]

    per_turn, once, replayed = both(bundle.renderer, bundle.engine, rows, play, sampling=SamplingParams(max_tokens=8))
    assert replayed == 1
    assert_same(per_turn, once)
    assert once[0].stop_reason == stop and once[1].stop_reason == "done"


def test_a_conversation_longer_than_the_context_goes_the_rollout_path(tiny, probe_env):
    bundle = tiny("qwen2_5_vl")
    rows = [probe_row(["image"] * 4)]
    full = RolloutGenerator(bundle.renderer, bundle.engine, RolloutConfig(progress=False)).run(
        rows, script=_script(["a"] * 5)
    )
    limit = full[0].turns[2].gen_start  # turn 2's prompt no longer fits
    per_turn, once, replayed = both(bundle.renderer, bundle.engine, rows, _script(["a"] * 5), max_context=limit)
    assert replayed == 1
    assert_same(per_turn, once)
    assert once[0].stop_reason == "length" and len(once[0].turns) == 2


def test_a_template_that_rewrites_history_is_still_refused(tiny, probe_env):
    """A first line that counts the conversation's images: the one render's first prompt differs from the first
    render, so the episode goes the rollout path, whose splice check raises (naming the turn)."""
    bundle = tiny("qwen2_5_vl")
    renderer = renderer_with_template(bundle, count_images_in_system)
    gen = RolloutGenerator(renderer, bundle.engine, RolloutConfig(progress=False))
    with pytest.raises(PrefixError, match=r"turn 0: .*first difference at token \d+"):
        gen.run([probe_row(["image"])], script=_script(["left", "up"]))
    assert gen.replayed == 1


def upper_left(template: str) -> str:
    """A template that rewrites one word of every assistant turn (the construction-time probe does not use it)."""
    old = "<|im_start|>assistant\n{{ render_content(message.content) }}"
    assert old in template
    return template.replace(
        old, "<|im_start|>assistant\n{{ render_content(message.content) | replace('left', 'LEFT') }}"
    )


def test_a_template_that_rewrites_an_assistant_turn_is_still_refused(tiny, probe_env):
    """The one render's assistant ids differ from the scripted ids: handed back, and the splice check raises."""
    bundle = tiny("qwen2_5_vl")
    gen = RolloutGenerator(renderer_with_template(bundle, upper_left), bundle.engine, RolloutConfig(progress=False))
    with pytest.raises(HistoryRewriteError, match="turn 0"):
        gen.run([probe_row(["text"])], script=_script(["go left", "up"]))
    assert gen.replayed == 1


def test_a_text_a_special_token_closes_before_a_stop_string_goes_the_rollout_path(tiny, probe_env):
    """Cut at the stop string, the text ends in ``<|endoftext|>``: the rollout path appends no end of turn then."""
    bundle = tiny("qwen2_5_vl")
    sampling = SamplingParams(max_tokens=8, stop=("STOP",), include_stop_str_in_output=False)
    rows = [probe_row(["text"])]
    per_turn, once, replayed = both(
        bundle.renderer, bundle.engine, rows, _script(["left<|endoftext|>STOP", "up"]), sampling=sampling
    )
    assert replayed == 1
    assert_same(per_turn, once)
