"""The HTTP routes of the Tinker API (FastAPI), under ``/api/v1/``, onto a :class:`~vlrl.tinker.service.Service`.

- Every route but ``healthz`` needs ``X-API-Key`` equal to the server's key (the SDK sends
  ``TINKER_API_KEY`` there; it must start with ``tml-``).
- Bodies larger than ``max_body_bytes`` are refused (413) as they stream in: a declared ``Content-Length`` over the
  limit before any byte is read, a chunked body as soon as what was read passes it (the rest is never read); and
  again after zstd decompression.
- ``forward_backward`` takes protobuf only (what SDK ≥ 0.25 sends), zstd or not.
- ``retrieve_future`` long-polls (up to ``long_poll_s``) and then answers ``{"type": "try_again"}``;
  ``SampleResponse`` / ``ForwardBackwardOutput`` results go out as protobuf (the SDK accepts nothing else).
- Anything the server does not do answers with one line naming it (HTTP 400 / 404), never a hang.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (Request) at runtime

import asyncio
import hmac
import io
import time
from typing import Any

from vlrl.errors import BadInputError
from vlrl.tinker.futures import Failed, Json, Proto, UnknownIdError
from vlrl.tinker.service import Service
from vlrl.tinker.wire import decode_forward_backward

PREFIX = "/api/v1"
PROTOBUF = "application/x-protobuf"
OPEN_PATHS = frozenset({f"{PREFIX}/healthz"})
UNSUPPORTED = {
    "save_weights": "save_weights (training checkpoints) is not supported by vlrl tinker-serve yet",
    "load_weights": "load_weights / create_training_client_from_state is not supported by vlrl tinker-serve yet",
    "forward": "the JSON forward route is gone since SDK 0.25; use forward_backward (forward_only) in protobuf",
    "create_custom_loss": "server-side custom losses are not supported (the SDK runs them client-side)",
    "save_weights_external": "save_weights_external is not supported by vlrl tinker-serve",
    "copy_weights": "copy_weights is not supported by vlrl tinker-serve",
}
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": True,
    "parallel_fwdbwd_chunks": True,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
"""Feature flags for the SDK (``ClientConfigResponse``): API keys only, httpx transport, zstd protobuf bodies."""


def build_app(service: Service, api_key: str, *, max_body_bytes: int = 256 << 20):
    """The FastAPI app; ``api_key`` is compared in constant time on every route but ``healthz``."""
    from fastapi import FastAPI

    app = FastAPI(title="vlrl tinker-serve", docs_url=None, redoc_url=None, openapi_url=None)
    # Inside the guard's middleware (added after, so outside): a receive that raises within a BaseHTTPMiddleware's
    # task group reaches the exception handlers wrapped in an ExceptionGroup (a 500), not as itself.
    app.add_middleware(_BodyLimit, limit=max_body_bytes)
    _guard(app, api_key.encode(), max_body_bytes)
    _info_routes(app, service, max_body_bytes)
    _work_routes(app, service, max_body_bytes)

    @app.api_route(f"{PREFIX}/{{rest:path}}", methods=["GET", "POST", "PUT", "DELETE"])
    def unsupported(rest: str):
        return _error(
            404 if rest not in UNSUPPORTED else 400,
            UNSUPPORTED.get(rest, f"{PREFIX}/{rest} is not supported by vlrl tinker-serve"),
        )

    return app


def _error(status: int, message: str, *, close: bool = False):
    """``close``: end the connection after the answer, so the rest of a refused body is never read (uvicorn
    would otherwise read and discard it to keep the connection alive)."""
    from fastapi.responses import JSONResponse

    headers = {"Connection": "close"} if close else None
    return JSONResponse({"detail": message, "error": message}, status_code=status, headers=headers)


def _guard(app, expected: bytes, max_body_bytes: int) -> None:
    """The API key and the declared body size on every request; vlrl's refusals as 400, unknown ids as 404."""
    from fastapi import Request

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.url.path not in OPEN_PATHS:
            got = request.headers.get("x-api-key", "").encode()
            if not hmac.compare_digest(got, expected):
                return _error(401, "missing or wrong X-API-Key (set TINKER_API_KEY to this server's key)")
        size = request.headers.get("content-length")
        if size is not None and not size.strip().isdigit():
            return _error(400, f"Content-Length {size!r} is not a number of bytes", close=True)
        if size is not None and int(size) > max_body_bytes:
            return _error(
                413, f"request body of {size} bytes is over this server's limit of {max_body_bytes}", close=True
            )
        return await call_next(request)

    @app.exception_handler(BodyTooLargeError)
    async def too_large(request: Request, exc: BodyTooLargeError):
        return _error(413, str(exc), close=True)

    @app.exception_handler(BadInputError)
    async def bad_input(request: Request, exc: BadInputError):
        return _error(400, str(exc))

    @app.exception_handler(UnknownIdError)
    async def unknown(request: Request, exc: UnknownIdError):
        return _error(404, str(exc.args[0]))


class BodyTooLargeError(BadInputError):
    """A request body passed the server's limit while it was being read (answered 413)."""


class _BodyLimit:
    """ASGI middleware: counts a request's body as the app reads it and raises :class:`BodyTooLargeError` the
    moment it passes ``limit``, so a chunked body (no length up front) is never read past the limit; the server
    stops reading (uvicorn pauses the socket while the app is not receiving) and closes after the 413."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLargeError(f"request body over this server's limit of {self.limit} bytes")
            return message

        return await self.app(scope, limited, send)


async def _body_json(request, limit: int) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > limit:  # a chunked body declares no length up front
        raise BadInputError(f"request body over this server's limit of {limit} bytes")
    try:
        data = await request.json()
    except ValueError:
        raise BadInputError("request body is not JSON") from None
    if not isinstance(data, dict):
        raise BadInputError("request body must be a JSON object")
    return data


def _info_routes(app, service: Service, limit: int) -> None:
    """Health, capabilities, the SDK's feature flags, sessions, telemetry (dropped) and the JSON operations."""
    from fastapi import Request

    @app.get(f"{PREFIX}/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.get(f"{PREFIX}/get_server_capabilities")
    def capabilities() -> dict:
        return service.capabilities()

    @app.post(f"{PREFIX}/client/config")
    def client_config() -> dict:
        return dict(CLIENT_CONFIG)

    @app.post(f"{PREFIX}/client/dynamic_config")
    def client_dynamic_config() -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.post(f"{PREFIX}/telemetry")
    def telemetry() -> dict:
        return {"status": "accepted"}  # TINKER_TELEMETRY=0 turns it off in the SDK; nothing is kept here

    @app.post(f"{PREFIX}/session_heartbeat")
    def session_heartbeat() -> dict:
        return {"type": "session_heartbeat"}

    @app.post(f"{PREFIX}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str, request: Request) -> None:
        service.finish_session(session_id, await _body_json(request, limit))

    @app.get(f"{PREFIX}/samplers/{{sampler_id}}")
    def get_sampler(sampler_id: str) -> dict:
        key = service.sampling_sessions.get(sampler_id)
        if key is None:
            raise UnknownIdError(f"unknown sampler_id {sampler_id!r}")
        return {
            "sampler_id": sampler_id,
            "base_model": service.cfg.model_name,
            "model_path": None if key == "base" else key,
        }

    json_routes = {
        "create_session": service.create_session,
        "create_model": service.create_model,
        "get_info": service.get_info,
        "unload_model": service.unload_model,
        "optim_step": service.optim_step,
        "save_weights_for_sampler": service.save_weights_for_sampler,
        "create_sampling_session": service.create_sampling_session,
        "asample": service.sample,
    }
    for name, handler in json_routes.items():
        app.add_api_route(f"{PREFIX}/{name}", _json_route(handler, limit), methods=["POST"], name=name)


def _work_routes(app, service: Service, limit: int) -> None:
    """``forward_backward`` (protobuf in) and ``retrieve_future`` (long poll; protobuf out where the SDK wants it)."""
    from fastapi import Request
    from fastapi.responses import Response

    @app.post(f"{PREFIX}/forward_backward")
    async def forward_backward(request: Request):
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise BadInputError(
                f"forward_backward takes {PROTOBUF} (tinker SDK >= 0.25), got {request.headers.get('content-type')!r}"
            )
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            raw = _unzstd(raw, limit)
        return service.forward_backward(decode_forward_backward(raw))

    @app.post(f"{PREFIX}/retrieve_future")
    async def retrieve_future(request: Request):
        rid = str((await _body_json(request, limit)).get("request_id"))
        deadline = time.monotonic() + service.cfg.long_poll_s
        delay = 0.002
        while (outcome := service.futures.peek(rid)) is None and time.monotonic() < deadline:
            await asyncio.sleep(delay)  # async wait: hundreds of polls need no threads
            delay = min(delay * 2, 0.05)
        if outcome is None:
            return {"type": "try_again", "request_id": rid, "queue_state": "active"}
        if isinstance(outcome, Failed):
            return {"error": outcome.error, "category": outcome.category}
        if isinstance(outcome, Proto):
            if PROTOBUF not in request.headers.get("accept", ""):
                return _error(406, f"this result is {PROTOBUF} only (tinker SDK >= 0.25 asks for it)")
            return Response(outcome.data, media_type=PROTOBUF)
        assert isinstance(outcome, Json)
        return outcome.data


def _json_route(handler, limit: int):
    from fastapi import Request

    async def route(request: Request) -> dict:
        return handler(await _body_json(request, limit))

    return route


def _unzstd(raw: bytes, limit: int) -> bytes:
    """zstd-decompress a body, refusing one that would grow past ``limit`` bytes (a zip bomb)."""
    import zstandard

    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            while len(out) <= limit and (piece := reader.read(1 << 20)):
                out += piece
    except zstandard.ZstdError as exc:
        raise BadInputError(f"body is not valid zstd ({exc})") from None
    if len(out) > limit:
        raise BadInputError(f"decompressed body over this server's limit of {limit} bytes")
    return bytes(out)
