"""Fixtures of the Tinker-service tests: one server for the tiny Qwen2.5-VL checkpoint (in-process, on loopback),
the SDK pointed at it, and image conversations."""

from __future__ import annotations

import os

import pytest
from tinker_helpers import ARCH, MODEL_NAME


@pytest.fixture(scope="session")
def tinker_server(vlrl_model_dir):
    """A running ``vlrl tinker-serve`` (its :class:`~vlrl.tinker.server.Running` handle), the SDK's
    environment variables set for the session."""
    from vlrl.tinker.server import build_service, serve_in_thread
    from vlrl.tinker.service import ServiceConfig

    cfg = ServiceConfig(
        base_model=str(vlrl_model_dir(ARCH)), model_name=MODEL_NAME, long_poll_s=2.0, lr_scale={"embed": 0.1}
    )  # as recipe color_square_rl (test_same_update checks it applies)
    service = build_service(cfg)
    running = serve_in_thread(service)
    saved = {k: os.environ.get(k) for k in running.env()}
    os.environ.update(running.env())
    yield running
    running.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def service_client(tinker_server):
    import tinker

    client = tinker.ServiceClient()
    yield client
    client.close("success").result(timeout=30)  # its session's heartbeats end with the server


@pytest.fixture(scope="session")
def renderer(vlrl_model_dir):
    from vlrl.render.embedded import EmbeddedRenderer

    return EmbeddedRenderer.from_pretrained(vlrl_model_dir(ARCH))
