"""The HTTP client against fake servers: routing, garbage, slowness, refusals (no vLLM needed)."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from vlrl.errors import BadInputError
from vlrl.vllm.client import ClientConfig, VllmClient
from vlrl.vllm.server import VllmServerError

pytest.importorskip("httpx")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # the name BaseHTTPRequestHandler dispatches to
        self.rfile.read(int(self.headers.get("content-length", 0)))
        kind = self.path.strip("/")
        if kind == "slow":
            time.sleep(2)
        code, body = {
            "garbage": (200, b"<html>"),
            "list": (200, b"[1]"),
            "refuse": (400, b'{"error": {"message": "no"}}'),
            "down": (503, b"busy"),
        }.get(kind, (200, b'{"ok": 1}'))
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(params=["picked", "httpx"])
def library(request, monkeypatch):
    """The HTTP library the client picks (httpx2 where installed), and plain httpx, its fallback."""
    from vlrl.vllm import client

    if request.param == "httpx":
        import httpx

        monkeypatch.setattr(client, "_httpx", lambda: httpx)
    return client._httpx().__name__


def test_httpx2_is_picked_where_installed_else_httpx(monkeypatch):
    import importlib.util

    from vlrl.vllm.client import _httpx

    want = "httpx2" if importlib.util.find_spec("httpx2") else "httpx"
    assert _httpx().__name__ == want
    monkeypatch.setitem(__import__("sys").modules, "httpx2", None)  # not installed
    assert _httpx().__name__ == "httpx"


def test_errors_name_url_and_problem(fake_url, library):
    client = VllmClient(fake_url, ClientConfig(timeout_s=0.5, retries=1, backoff_s=0.01))
    assert client.run(client.post(fake_url, "/ok", {}, what="t")) == {"ok": 1}
    for path, err, text in [
        ("/garbage", VllmServerError, "garbage"),
        ("/list", VllmServerError, "garbage"),
        ("/refuse", BadInputError, "no"),
        ("/down", VllmServerError, "2 attempts: HTTP 503"),
        ("/slow", VllmServerError, "timeout"),
    ]:
        with pytest.raises(err, match=text) as info:
            client.run(client.post(fake_url, path, {}, what="t"))
        assert fake_url in str(info.value)
    client.close()


def test_unreachable_server_fails_fast():
    client = VllmClient("http://127.0.0.1:9", ClientConfig(retries=2, backoff_s=0.01))
    t0 = time.monotonic()
    with pytest.raises(VllmServerError, match="unreachable"):
        client.run(client.post(client.urls[0], "/x", {}, what="t"))
    assert time.monotonic() - t0 < 5


def test_round_robin_and_sticky_routing():
    client = VllmClient(["http://a", "http://b", "http://c"])
    assert [client.pick() for _ in range(6)] == ["http://a", "http://b", "http://c"] * 2
    assert len({client.pick(("traj", 7)) for _ in range(5)}) == 1
    assert len({client.pick(k) for k in range(30)}) == 3


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    """Records the most requests it held at once, per (server port, path). Each request is held at least 50 ms
    and until ``WANT[path]`` of its kind have been in flight at once on its server (at most 5 s), so a loaded machine
    still sees every request the client lets through at once, and a client that holds some back shows it."""

    WANT = {"/render": 3, "/generate": 4}
    cond = threading.Condition()
    now: dict[tuple[int, str], int] = {}
    most: dict[tuple[int, str], int] = {}

    def do_POST(self):  # the name BaseHTTPRequestHandler dispatches to
        self.rfile.read(int(self.headers.get("content-length", 0)))
        key = (self.server.server_address[1], self.path)
        with self.cond:
            self.now[key] = self.now.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.now[key])
            self.cond.notify_all()
        time.sleep(0.05)
        with self.cond:
            self.cond.wait_for(lambda: self.most[key] >= self.WANT.get(self.path, 0), timeout=5.0)
            self.now[key] -= 1
        body = b'{"ok": 1}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_in_flight_limit_per_server_and_route():
    """Renders are held to ``renders_in_flight`` per server (the API process renders one at a time, and a
    generate queued behind every render of a batch waits for the last); other routes are not held back."""
    import asyncio

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    client = VllmClient(urls, ClientConfig(renders_in_flight=3))

    async def burst() -> None:
        limit = client.config.renders_in_flight
        await asyncio.gather(  # round-robin: half of each route to each server
            *(client.post_any("/render", {}, what="t", in_flight=limit) for _ in range(24)),
            *(client.post_any("/generate", {}, what="t") for _ in range(12)),
        )

    client.run(burst())
    ports = [s.server_address[1] for s in servers]
    assert [_CountingHandler.most[(p, "/render")] for p in ports] == [3, 3]  # 12 renders each, 3 at a time
    assert min(_CountingHandler.most[(p, "/generate")] for p in ports) >= 4  # 6 each, not held back
    client.close()
    for s in servers:
        s.shutdown()


def test_bodies_are_the_json_of_their_dict_with_base64_items_spliced_in():
    """``json_bytes`` (what ``post`` sends) is byte for byte ``json.dumps`` of the body; a base64 item is spliced in,
    not scanned, wherever it sits, and every other string is escaped as json would."""
    import base64
    import json

    from vlrl.vllm.client import B64, json_bytes

    item = B64(base64.b64encode(bytes(range(256)) * 300).decode())
    body = {
        "token_ids": list(range(50)),
        "features": {"kwargs_data": {"image": [item, None, B64("QUJD")]}, "mm_hashes": {"image": ['a"b', "c"]}},
        "sampling_params": {"stop": ['"\n\\', "é", "\u2028"], "extra_args": {"vlrl_ban": [1, 2]}, "t": 0.7},
        "nested": [[item], {"x": [item]}],
    }
    got = json_bytes(body)
    assert got == json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    assert json.loads(got)["features"]["kwargs_data"]["image"][0] == item
    assert json_bytes({"a": "plain"}) == b'{"a":"plain"}'
