"""Shared fixtures: tiny checkpoints of the three architectures, loaded once per session."""

from __future__ import annotations

import functools

import pytest

from vlrl.models.archs import ARCHS

pytest_plugins = ["pytester"]


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    """Each of the three architectures (a test that takes ``arch`` runs once per architecture)."""
    return request.param


@pytest.fixture(scope="session")
def tiny(vlrl_model_dir):
    """``tiny(arch)`` -> a loaded bundle (path, renderer, engine), cached for the session."""

    @functools.cache
    def get(arch: str):
        from vlrl.engines.embedded import EmbeddedEngine
        from vlrl.render.embedded import EmbeddedRenderer

        path = vlrl_model_dir(arch)
        return Bundle(path, EmbeddedRenderer.from_pretrained(path), EmbeddedEngine.from_pretrained(path))

    return get


class Bundle:
    def __init__(self, path, renderer, engine):
        self.path, self.renderer, self.engine = path, renderer, engine

    @property
    def model(self):
        return self.engine.model

    @property
    def tokenizer(self):
        return self.renderer.tokenizer


@pytest.fixture(scope="session")
def color_square_warm_start(tmp_path_factory):
    """``(model dir, eval reward)`` of recipe color_square_rl's format-only warm start: its SFT phase alone
    (the expert's answer format with a random colour), saved as a model dir. One per session: the RL tests of
    ``vlrl train`` (tests/train) and of the Tinker API (tests/tinker) start from the same one (~1 min on 2 cores)."""
    from vlrl.checks.training import RunRecord
    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_processor
    from vlrl.train.config import load_config
    from vlrl.train.loop import train

    out = tmp_path_factory.mktemp("color_square_warm_start")
    cfg = load_config("color_square_rl", ["run.steps=0", f"run.out={out / 'run'}", "run.progress=False"])
    assert cfg.sft.expert == "color_square/format" and cfg.sft.steps > 0
    captured = {}
    train(cfg, on_start=lambda model: captured.update(model=model))
    evals = {e["label"]: e["eval_reward_mean"] for e in RunRecord.load(out / "run").phase("eval")}
    model_dir = out / "model"
    captured["model"].save_pretrained(model_dir)
    load_processor(cached_model_dir(cfg.model.arch, cfg.model.size, seed=cfg.model.seed)).save_pretrained(model_dir)
    return model_dir, evals["after_sft"]
