"""A vLLM server's limits come from the run: context from the model, images per prompt from the env,
KV cache sized for one full context; a limit that cannot fit is refused before any server starts."""

from __future__ import annotations

import json
import shutil

import pytest

from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.vllm.capabilities import VllmCapabilities
from vlrl.vllm.limits import VllmLimitError, episode_images, resolve_limits
from vlrl.vllm.server import ServerConfig

ARCH = "qwen2_5_vl"


@pytest.fixture
def model_dir(vlrl_model_dir):
    return vlrl_model_dir(ARCH)


def test_defaults_come_from_the_model(model_dir):
    limits = resolve_limits(model_dir)
    # tiny: 4096 positions; the smallest image (min_pixels 56x56) is 4 tokens; K+V of 2 layers x 1 head x 32 fp32
    assert (limits.max_model_len, limits.max_images_per_prompt, limits.kv_cache_gib) == (4096, 1024, 1)
    assert resolve_limits(model_dir, max_model_len=1024, max_images_per_prompt=8).max_images_per_prompt == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_model_len": 5000}, "max_position_embeddings"),
        ({"max_model_len": 0}, "must be 1..4096"),
        ({"max_model_len": 40}, "cannot hold one image"),
        ({"max_images_per_prompt": 1025}, "holds 1..1024 images"),
        ({"max_images_per_prompt": 0}, "holds 1..1024 images"),
        ({"max_model_len": 400, "max_images_per_prompt": 101}, "a 400-token context holds 1..100 images"),
        ({"kv_cache_gib": 0}, "cannot hold one 4096-token sequence"),
    ],
)
def test_limits_that_cannot_fit_are_refused_up_front(model_dir, kwargs, match):
    with pytest.raises(VllmLimitError, match=match):
        resolve_limits(model_dir, **kwargs)
    with pytest.raises(VllmLimitError, match=match):  # the server config refuses at construction, before a launch
        ServerConfig(str(model_dir), **kwargs)


def test_kv_cache_sized_for_a_full_context(model_dir, tmp_path):
    """A 2b-shaped model (28 layers, 2 KV heads of 128, 32k positions): one fp32 sequence needs 1.75 GiB."""
    shutil.copytree(model_dir, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["text_config"].update(num_hidden_layers=28, num_key_value_heads=2, head_dim=128, max_position_embeddings=32768)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert resolve_limits(tmp_path / "m").kv_cache_gib == 2
    with pytest.raises(VllmLimitError, match="2 GiB needed"):
        resolve_limits(tmp_path / "m", kv_cache_gib=1)
    with pytest.raises(VllmLimitError, match="no config.json"):
        resolve_limits(tmp_path)


@pytest.mark.parametrize(
    "env, extras, max_turns, want",
    [
        ("maze2d/5x5", {}, None, 8),  # one image per observation, 8 turns
        ("maze2d/easy", {}, None, 30),
        ("maze2d/easy", {}, 8, 8),  # the run's turn budget
        ("maze2d/5x5", {"max_turns": 12}, 20, 12),  # capped by the env's own, as the rollout does
        ("color_square", {}, None, 1),
    ],
)
def test_episode_images(env, extras, max_turns, want):
    assert episode_images(env, extras, max_turns) == want


def test_server_argv_carries_the_limits_and_not_the_key(model_dir):
    cfg = ServerConfig(str(model_dir), max_images_per_prompt=episode_images("maze2d/easy"))
    cpu = VllmCapabilities("0.32.0", "cpu")  # the CI build (test_vllm_capabilities: the flags per build)
    argv, env = cfg.argv(8000, cpu), cfg.env(cpu)
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 30, "video": 0}
    assert argv[argv.index("--middleware") + 1] == "vlrl.vllm.auth.ApiKeyMiddleware"
    assert argv[argv.index("--worker-extension-cls") + 1] == "vlrl.vllm.worker.VlrlWorkerExtension"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert len(cfg.api_key) >= 32 and env["VLLM_API_KEY"] == cfg.api_key  # in the environment, private to the user
    assert not any(cfg.api_key in a for a in argv) and cfg.api_key not in repr(cfg)  # argv is world-readable
    assert ServerConfig(str(model_dir)).api_key != cfg.api_key  # a fresh key per server config


@pytest.mark.vllm
def test_maze_episodes_play_every_turn_on_vllm_as_embedded(vllm_stack, tiny):
    """The measured bug: maze2d/5x5 episodes (8 turns, one image each) ended after 4 turns with env_error on
    vLLM (4 images per prompt at most) while the embedded engine played all 8."""
    stack, bundle = vllm_stack(ARCH), tiny(ARCH)
    assert stack.config.max_images_per_prompt >= 8
    rows = [{"prompt": None, "env_class": "maze2d/5x5", "extras": {}, "seed": s} for s in range(3)]
    cfg = RolloutConfig(sampling=SamplingParams(temperature=1.0, max_tokens=6), seed=5, progress=False)
    got = RolloutGenerator(stack.renderer, stack.engine, cfg).run(rows)
    want = RolloutGenerator(bundle.renderer, bundle.engine, cfg).run(rows)
    assert [(len(t.turns), t.stop_reason) for t in got] == [(len(t.turns), t.stop_reason) for t in want], [
        t.error for t in got
    ]
    assert all(t.stop_reason != "env_error" for t in got) and max(len(t.turns) for t in got) == 8
