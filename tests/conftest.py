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
