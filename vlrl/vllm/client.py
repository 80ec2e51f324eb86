"""HTTP to one or more vLLM servers: a pooled async client on its own event-loop thread.

Every request, from any thread or event loop, runs on one private loop that owns one
``httpx.AsyncClient`` (one connection pool), so sync callers (``generate``) and async callers
(``agenerate`` in the rollout's loop) share the pool and the server sees concurrent requests it
can batch. Failures become :class:`VllmServerError` naming the URL and what went wrong:

- connection refused / reset, 502/503/504, timeouts: retried ``retries`` times with exponential
  backoff (token-in/token-out generation with a seed is deterministic, so a retry is safe), then
  raised — a dead server gives an error within seconds, never a hang;
- 401: the server wants the run's API key (``api_key``, default ``$VLRL_VLLM_API_KEY``), sent
  with every request as ``Authorization: Bearer`` (see ``vlrl.vllm.auth``);
- other 4xx: :class:`BadInputError` with the server's message (not retried);
- a body that is not the JSON object expected: "answered garbage".

Bodies are encoded by :func:`json_bytes`: an image item is a base64 string of ~0.8 MB (bf16, 224 px) that needs no
escaping, so it is marked :class:`B64` and spliced into the JSON instead of scanned by the encoder. Profiled on an
H100 host (py-spy, 256 image requests in flight, benchmarks/results/vllm_gpu_h100/82c07ee/pyspy_2e24736/): before,
the client's one loop thread spent half its busy time in ``json.dumps`` of these bodies (390 of 775 samples), which
held back every other request's send.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
import uuid
import zlib
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from vlrl.errors import BadInputError
from vlrl.vllm.capabilities import GENERATE, RENDER, VllmCapabilities, from_server
from vlrl.vllm.server import VllmServerError

__all__ = ["B64", "GENERATE", "RENDER", "ClientConfig", "VllmClient", "json_bytes", "require"]
_RETRY_STATUS = frozenset({502, 503, 504})
KEY_ENV = "VLRL_VLLM_API_KEY"
"""The key of servers vlrl attaches to (``VLRL_VLLM_URL``; ``vlrl serve`` prints it).
Servers a stack starts get a fresh one."""


@dataclass(frozen=True)
class ClientConfig:
    timeout_s: float = 120.0
    """Per-request read timeout (a generation of max_tokens must finish within it)."""
    connect_timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.25
    """First retry after backoff_s, then 2x, 4x, ..."""
    max_connections: int = 512
    """Requests in flight across all servers (a connection each): a rollout of 256 episodes generates at once
    (at 64, the cap before, a server never batched more than 64 sequences)."""
    renders_in_flight: int | None = 8
    """Render requests in flight per server (None: no limit). A server's API process renders (processes images)
    one request at a time, ahead of every generate queued behind, so with a whole batch's renders sent at once the
    first generate waits for the last render; a few in flight keep the API process busy and let each generate in
    as its render ends. Measured on an H100 (2b bf16, 64 fresh requests, one timing each): vlrl's path at 0.60× raw
    with 8, 0.64× with no limit, 0.69× with 4, 0.67× with 16 — the order is not where its time goes
    (benchmarks/results/vllm_gpu_h100/NOTE.md, run 13)."""


class VllmClient:
    """POST JSON to servers ``urls[i]``; ``pick(key)`` routes round-robin or by a sticky key."""

    def __init__(self, urls: str | Sequence[str], config: ClientConfig = ClientConfig(), *, api_key: str | None = None):
        self.urls = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("VllmClient needs at least one server URL")
        self.urls = tuple(u.rstrip("/") for u in self.urls)
        self.config = config
        key = api_key if api_key is not None else os.environ.get(KEY_ENV, "")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._rr = itertools.count()
        self._dead: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None
        self._lock = threading.Lock()
        self._caps: VllmCapabilities | None = None
        self._caps_lock: asyncio.Lock | None = None
        self._gates: dict[tuple[str, str, int], asyncio.Semaphore] = {}

    # ------------------------------------------------------------------ routing

    def pick(self, key: Any = None) -> str:
        """A live server URL: the next in round-robin order, or a fixed one per ``key`` (e.g. a trajectory id).

        Servers marked dead (:meth:`mark_dead`) are skipped while any other is live."""
        urls = self.live_urls() or self.urls
        if len(urls) == 1:
            return urls[0]
        if key is None:
            return urls[next(self._rr) % len(urls)]
        return urls[zlib.crc32(repr(key).encode()) % len(urls)]

    def live_urls(self) -> tuple[str, ...]:
        return tuple(u for u in self.urls if u not in self._dead)

    def mark_dead(self, url: str) -> None:
        """Stop routing to ``url`` (it was unreachable after the retries)."""
        self._dead.add(url)

    # ------------------------------------------------------------------ what the servers support

    async def acapabilities(self) -> VllmCapabilities:
        """The servers' vLLM (``GET /version`` + ``GET /openapi.json`` of each, asked once): every server must
        run the same version, and it must be one vlrl supports (else one :class:`VllmUnsupportedError`)."""
        if self._caps is not None:
            return self._caps
        self._caps_lock = self._caps_lock or asyncio.Lock()
        async with self._caps_lock:
            if self._caps is None:
                found = [await self._ask(url) for url in self.live_urls() or self.urls]
                versions = {c.version for c in found}
                if len(versions) != 1:
                    raise VllmServerError(f"the servers {', '.join(self.urls)} run different vLLMs: {sorted(versions)}")
                self._caps = found[0]
        return self._caps

    def capabilities(self) -> VllmCapabilities:
        return self.run(self.acapabilities())

    async def _ask(self, url: str) -> VllmCapabilities:
        version = await self.get(url, "/version", what="vLLM version")
        try:
            openapi: dict | None = await self.get(url, "/openapi.json", what="vLLM routes")
        except BadInputError:  # 404 under --disable-fastapi-docs: the version's defaults apply
            openapi = None
        return from_server(version, openapi).check(url)

    async def get(self, url: str, path: str, *, what: str) -> dict:
        """GET ``url + path`` (once: a server that does not answer its metadata routes is not usable)."""
        httpx = _httpx()
        target = f"{url}{path}"
        try:
            resp = await self._http().get(target)
        except httpx.HTTPError as exc:
            raise VllmServerError(f"{what}: GET {target} failed: {type(exc).__name__}: {exc}") from None
        return self._decode(resp, target, what)

    # ------------------------------------------------------------------ loop

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="vlrl-vllm-client", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, coro: Coroutine) -> Future:
        """Run ``coro`` on the client's loop; a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def run(self, coro: Coroutine):
        return self.submit(coro).result()

    async def arun(self, coro: Coroutine):
        """Await ``coro`` (run on the client's loop) from any other event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        client, self._client = self._client, None
        if client is not None:
            asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)

    def _http(self):
        if self._client is None:  # created on the client's loop, used only there
            httpx = _httpx()
            c = self.config
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(c.timeout_s, connect=c.connect_timeout_s),
                limits=httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=c.max_connections),
            )
        return self._client

    # ------------------------------------------------------------------ requests (on the client's loop)

    async def post(self, url: str, path: str, body: dict, *, what: str) -> dict:
        """POST ``body`` to ``url + path``; the JSON object answered, or a vlrl error naming ``what``."""
        httpx = _httpx()
        c, target = self.config, f"{url}{path}"
        content, headers = json_bytes(body), {"Content-Type": "application/json"}
        last, unreachable = "", False
        for attempt in range(c.retries + 1):
            if attempt:
                await asyncio.sleep(c.backoff_s * 2 ** (attempt - 1))
            try:
                resp = await self._http().post(target, content=content, headers=headers)
            except httpx.TimeoutException as exc:
                last = f"no answer within the timeout ({type(exc).__name__}, read timeout {c.timeout_s:g} s)"
                unreachable = False
                continue
            except httpx.TransportError as exc:
                last = f"server unreachable or connection lost ({type(exc).__name__}: {exc})"
                unreachable = True
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                unreachable = False
                continue
            return self._decode(resp, target, what)
        err = VllmServerError(f"{what}: POST {target} failed after {c.retries + 1} attempts: {last}")
        err.unreachable = unreachable  # connection refused / lost: another server may take the request
        raise err

    async def post_any(
        self,
        path: str,
        body: dict,
        *,
        what: str,
        route_key: Any = None,
        body_for: Callable[[str], dict] | None = None,
        in_flight: int | None = None,
    ) -> tuple[str, dict, list[str]]:
        """POST to a live server (:meth:`pick`); a server unreachable after the retries is marked dead and
        the request re-sent to the next live one. Returns ``(url, answer, urls that failed)``; raises when
        every server is unreachable (or at once with one server). For idempotent requests only (render,
        seeded token-in/token-out generate: every server holds the same weights). ``body_for(url)``: the body
        to send to that server (default ``body``). ``in_flight``: at most that many of this route's requests
        in flight per server (the rest wait here, in order)."""
        failed: list[str] = []
        while True:
            url = self.pick(route_key)
            try:
                sent = body if body_for is None else body_for(url)
                async with self._gate(url, path, in_flight):
                    answer = await self.post(url, path, sent, what=what)
                return url, answer, failed
            except VllmServerError as exc:
                if not exc.unreachable or len(self.urls) == 1:
                    raise
                self.mark_dead(url)
                failed.append(url)
                if not self.live_urls():
                    err = VllmServerError(f"{what}: every server is unreachable ({', '.join(self.urls)}); last: {exc}")
                    err.unreachable = True
                    raise err from exc

    def _gate(self, url: str, path: str, limit: int | None):
        """A semaphore per (server, route, limit), made on the client's loop; no limit: a null context."""
        if limit is None:
            return contextlib.nullcontext()
        key = (url, path, limit)
        if key not in self._gates:
            self._gates[key] = asyncio.Semaphore(limit)
        return self._gates[key]

    @staticmethod
    def _decode(resp, target: str, what: str) -> dict:
        if resp.status_code == 401:
            raise VllmServerError(
                f"{what}: the vLLM server at {target} wants the run's API key (HTTP 401): "
                f"pass api_key, or set ${KEY_ENV} to the key its `vlrl serve` printed"
            )
        if 400 <= resp.status_code < 500:
            raise BadInputError(
                f"{what}: the vLLM server at {target} refused the request "
                f"(HTTP {resp.status_code}): {_server_message(resp)}"
            )
        if resp.status_code != 200:
            raise VllmServerError(f"{what}: POST {target} answered HTTP {resp.status_code}: {resp.text[:500]}")
        if not resp.content.strip():
            return {}  # a bare 200 (the cache-reset routes); callers that need fields check them with require()
        try:
            data = resp.json()
        except ValueError:
            raise VllmServerError(f"{what}: POST {target} answered garbage (not JSON): {resp.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise VllmServerError(f"{what}: POST {target} answered garbage (a {type(data).__name__}, not an object)")
        return data


def _httpx():
    """``httpx2`` where installed (vLLM's own dependency in both builds), else ``httpx``: the same API, but httpcore
    1.0.9's connection pool re-scans every connection for every queued request at each assignment pass, which at a
    rollout's concurrency is most of the client's time; httpcore2 2.16 does one pass per assignment (pydantic/httpx2
    #974, #1075, #1076). Measured with ``benchmarks/vllm_client_overhead.py`` (64 image requests in flight to a
    stub server, 2 CPU cores): 10.0 ms of client time a request with httpx, 4.0 ms with httpx2 (text-only 7.2 vs
    1.5 ms); at 256 the one-process stub bounds both (5.2 vs 5.8 ms; benchmarks/results/vllm_client_overhead_cpu_*)."""
    try:
        import httpx2 as httpx
    except ImportError:
        import httpx
    return httpx


def _server_message(resp) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            return str(err.get("message", err))[:1000]
        return str(err)[:1000]
    return str(data)[:500]


class B64(str):
    """A base64 string (A-Z a-z 0-9 + / =: JSON-safe as it is), spliced into a body by :func:`json_bytes`."""

    __slots__ = ()


def json_bytes(body: Any) -> bytes:
    """``json.dumps(body, separators=(",", ":"), ensure_ascii=False)`` in UTF-8, every :class:`B64` string spliced in
    rather than scanned for characters to escape (a list is looked into only if its first element is a container
    or a string: a prompt's token ids are not walked)."""
    marks: list[B64] = []
    nonce = uuid.uuid4().hex

    def swap(x: Any) -> Any:
        if isinstance(x, B64):
            marks.append(x)
            return f"{nonce}{len(marks) - 1}"
        if isinstance(x, dict):
            return {k: swap(v) for k, v in x.items()}
        if isinstance(x, list) and x and isinstance(x[0], (dict, list, str)):
            return [swap(v) for v in x]
        return x

    text = json.dumps(swap(body), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not marks:
        return text.encode()
    parts = text.split(f'"{nonce}')
    out = [parts[0].encode()]
    for part in parts[1:]:
        k, rest = part.split('"', 1)
        out += [b'"', marks[int(k)].encode("ascii"), b'"', rest.encode()]
    return b"".join(out)


def require(data: dict, key: str, kind: type | tuple[type, ...], target: str):
    """``data[key]`` if present with type ``kind``; else the 'answered garbage' error."""
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind):
        raise VllmServerError(
            f"{target} answered garbage: field {key!r} is {type(value).__name__}, "
            f"expected {getattr(kind, '__name__', kind)}"
        )
    return value
