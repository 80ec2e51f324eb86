"""Deliberate corruption: each fault is loud, and only the broken episode is lost."""

from __future__ import annotations

import copy

import pytest
from rollout_env import probe_row

from vlrl.checks.trajectory import TrajectoryIntegrityError, check_trajectory
from vlrl.engines.types import SamplingParams
from vlrl.render.embedded import EmbeddedRenderer
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.rollout.splice import HistoryRewriteError, PrefixError

CFG = RolloutConfig(sampling=SamplingParams(max_tokens=4), progress=False)


def renderer_with_template(bundle, edit) -> EmbeddedRenderer:
    """The checkpoint's own processor with its chat template edited by ``edit(text) -> text``."""
    processor = copy.deepcopy(bundle.renderer.processor)
    processor.chat_template = edit(processor.chat_template)
    processor.tokenizer.chat_template = processor.chat_template
    return EmbeddedRenderer(processor)


def drop_think(template: str) -> str:
    """What thinking templates do: earlier assistant turns lose their <think> block."""
    old = "{{ render_content(message.content) }}\n{%- for call in message.tool_calls"
    assert old in template
    return template.replace(
        old,
        "{% if loop.last %}{{ render_content(message.content) }}{%- else %}"
        "{{ (message.content.split('</think>')[-1]).lstrip('\\n') }}{%- endif %}\n"
        "{%- for call in message.tool_calls",
    )


def count_images_in_system(template: str) -> str:
    """A template whose first line depends on the number of images in the whole conversation."""
    return (
        "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- if m.content is not string -%}"
        "{%- for p in m.content -%}{%- if p.type in ['image', 'image_url'] -%}{%- set ns.n = ns.n + 1 -%}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}<|im_start|>system\nImages: {{ ns.n }}<|im_end|>\n"
        + template
    )


def test_thinking_template_is_refused_with_a_clear_error(tiny):
    bundle = tiny("qwen3_vl")
    renderer = renderer_with_template(bundle, drop_think)
    with pytest.raises(HistoryRewriteError, match="rewrite earlier assistant turns.*mode='step'"):
        RolloutGenerator(renderer, bundle.engine, CFG)


def test_thinking_template_works_step_wise(tiny, probe_env):
    bundle = tiny("qwen3_vl")
    renderer = renderer_with_template(bundle, drop_think)
    gen = RolloutGenerator(
        renderer, bundle.engine, RolloutConfig(sampling=SamplingParams(max_tokens=64), mode="step", progress=False)
    )
    script = ["<think>\nleft or right\n</think>\n\nleft", "<think>\nnow up\n</think>\n\nup"]
    steps = gen.run([probe_row(["text"])], script=lambda env, row: script)
    assert [t.step_of for t in steps] == ["0-0", "0-0"]
    # Step 2's prompt is the template's own render: the earlier <think> block is gone from it.
    second = bundle.tokenizer.decode(list(steps[1].prompt_ids))
    assert "left or right" not in second and "<|im_start|>assistant\nleft<|im_end|>" in second
    for t in steps:
        assert (
            t.token_ids == renderer.render(list(t.messages), add_generation_prompt=False).token_ids[: len(t.token_ids)]
        )


def test_template_that_changes_history_later_raises_naming_the_turn(tiny, probe_env):
    bundle = tiny("qwen2_5_vl")
    renderer = renderer_with_template(bundle, count_images_in_system)
    gen = RolloutGenerator(renderer, bundle.engine, CFG)  # the text-only probe cannot see this one
    with pytest.raises(PrefixError, match=r"turn 0: .*first difference at token \d+"):
        gen.run([probe_row(["image"])])


def test_broken_image_ends_that_episode_only(tiny, probe_env):
    bundle = tiny("qwen2_vl")
    gen = RolloutGenerator(
        bundle.renderer, bundle.engine, RolloutConfig(sampling=SamplingParams(max_tokens=4), progress=False)
    )
    trajs = gen.run(
        [
            probe_row(["image", "image"], seed=1),
            probe_row(["image", "image"], seed=2, broken_image_at=1),
            probe_row(["text"], seed=3),
        ]
    )
    ok1, broken, ok2 = trajs
    assert ok1.stop_reason == ok2.stop_reason == "done"
    assert broken.stop_reason == "env_error"
    assert "observation cannot be rendered" in broken.error and "message 4, part 0" in broken.error
    assert len(broken.turns) == 2 and broken.n_images == 2  # the turns and images before the fault are kept
    assert broken.messages[-1]["role"] == "assistant"


def test_env_exception_ends_that_episode_only(tiny, probe_env):
    bundle = tiny("qwen2_vl")
    gen = RolloutGenerator(bundle.renderer, bundle.engine, CFG)
    good, bad = gen.run([probe_row(["text"], seed=1), probe_row(["text", "text"], seed=2, raise_at=1)])
    assert good.stop_reason == "done"
    assert bad.stop_reason == "env_error" and "RuntimeError: probe env failure" in bad.error
    assert len(bad.turns) == 2 and bad.turns[-1].reward == 0.0


class FailingEngine:
    """The real engine, failing from the n-th request on (a server that died mid-rollout)."""

    def __init__(self, engine, fail_after: int):
        self.engine, self.left = engine, fail_after
        self.max_context = engine.max_context

    async def agenerate(self, prompt, params):
        self.left -= 1
        if self.left < 0:
            raise ConnectionError("engine went away")
        return await self.engine.agenerate(prompt, params)


def test_engine_failure_keeps_the_turns_before_it(tiny, probe_env):
    bundle = tiny("qwen2_vl")
    gen = RolloutGenerator(bundle.renderer, FailingEngine(bundle.engine, 2), CFG)
    (traj,) = gen.run([probe_row(["image", "text", "image"])])
    assert traj.stop_reason == "engine_error" and "engine went away" in traj.error
    assert len(traj.turns) == 2


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])
def test_context_overflow_ends_with_length_and_consistent_tensors(tiny, probe_env, arch):
    bundle = tiny(arch)
    full = RolloutGenerator(bundle.renderer, bundle.engine, CFG).run([probe_row(["image"] * 4)])[0]
    limit = full.turns[2].gen_start  # turn 2's prompt no longer fits
    small = RolloutConfig(sampling=SamplingParams(max_tokens=4), max_context=limit, progress=False)
    (traj,) = RolloutGenerator(bundle.renderer, bundle.engine, small).run([probe_row(["image"] * 4)])
    assert traj.stop_reason == "length"
    assert len(traj.turns) == 2 and len(traj.token_ids) < limit
    assert traj.token_ids == full.token_ids[: len(traj.token_ids)]
    assert traj.n_images == full.turns[1].images_before
    pad = bundle.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    check_trajectory(traj, image_pad_id=pad)
    rows = int(traj.image_grid_thw.prod(-1).sum())
    assert traj.pixel_values.shape[0] == rows and rows < full.pixel_values.shape[0]


def test_integrity_check_catches_a_shifted_mask(tiny, probe_env):
    bundle = tiny("qwen2_vl")
    (traj,) = RolloutGenerator(bundle.renderer, bundle.engine, CFG).run([probe_row(["text"])])
    shifted = type(traj)(**{**traj.__dict__, "loss_mask": traj.loss_mask[1:] + (0,)})
    with pytest.raises(TrajectoryIntegrityError, match="loss mask"):
        check_trajectory(shifted, image_pad_id=bundle.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
