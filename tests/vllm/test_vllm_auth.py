"""The per-run API key: every route of a vlrl-started server but /health and /version needs it — the
weight-reload and dev routes that vLLM's own ``--api-key`` leaves open included — and vlrl's client sends it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from vlrl.vllm.auth import ApiKeyMiddleware
from vlrl.vllm.client import VllmClient
from vlrl.vllm.server import VllmServerError

httpx = pytest.importorskip("httpx")
ARCH = "qwen2_5_vl"
# every dev / RL / weight route vlrl's weight sync uses or vLLM's dev mode adds, and the unguarded extras
GUARDED = [
    ("POST", "/collective_rpc"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/is_paused"),
    ("POST", "/weight_checker"),
    ("POST", "/update_weight_version"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/reset_encoder_cache"),
    ("GET", "/server_info"),
    ("POST", "/sleep"),
    ("POST", "/update_weights"),
    ("POST", "/init_weight_transfer_engine"),
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/scale_elastic_ep"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions/render"),
    ("POST", "/inference/v1/generate"),
]


def _call(app, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    asyncio.run(app({"type": "http", "path": path, "headers": headers, "method": "POST"}, receive, send))
    return sent[0]["status"]


def test_middleware_refuses_without_the_key(monkeypatch):
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):  # fails closed
        ApiKeyMiddleware(inner)
    monkeypatch.setenv("VLLM_API_KEY", "k3y")
    app = ApiKeyMiddleware(inner)
    assert _call(app, "/collective_rpc", []) == 401
    assert _call(app, "/collective_rpc", [(b"authorization", b"Bearer nope")]) == 401
    assert _call(app, "/collective_rpc", [(b"authorization", b"Bearer k3y")]) == 200
    assert _call(app, "/health", []) == 200 and _call(app, "/version", []) == 200


@pytest.mark.vllm
def test_live_server_guards_every_route_and_the_client_sends_the_key(vllm_stack):
    stack = vllm_stack(ARCH)
    server, key = stack.servers[0], stack.config.api_key
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get("/health").status_code == 200 and http.get("/version").status_code == 200
        for bearer in (None, "wrong"):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            refused = {
                path: http.request(method, path, headers=headers, json={}).status_code for method, path in GUARDED
            }
            assert set(refused.values()) == {401}, refused
        assert http.get("/is_paused", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    stack.server_renderer.render([{"role": "user", "content": "hi"}])  # the stack's client holds the key
    stranger = VllmClient(stack.url, api_key="wrong")
    with pytest.raises(VllmServerError, match="VLRL_VLLM_API_KEY"):
        stranger.run(stranger.post(stack.url, "/collective_rpc", {"method": "vlrl_packed_error"}, what="rpc"))
    stranger.close()
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode(errors="replace")
    assert key not in cmdline and key not in server.log_tail(10**7)  # the key stays out of argv and the log
    assert os.environ.get("VLLM_API_KEY") != key  # and out of the test process's own environment
