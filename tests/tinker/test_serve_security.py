"""``vlrl tinker-serve``'s front door: a non-loopback bind needs ``--allow-remote`` and a configured key, and a
request body over the limit is refused (413) while it streams in, chunked or not, without the server reading it
all. Light: the size tests serve a stub service (no model); everything talks to 127.0.0.1 only."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import httpx
import pytest

LIMIT = 1 << 20  # 1 MiB
CHUNK = 64 << 10


def _serve(tmp_path, *args: str, key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"}
    if key is not None:
        env["TINKER_API_KEY"] = key
    cmd = [sys.executable, "-m", "vlrl", "tinker-serve", "--base-model", str(tmp_path), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.org"])
def test_a_non_loopback_bind_without_allow_remote_is_refused_in_one_line(tmp_path, host):
    out = _serve(tmp_path, "--host", host, key="tml-remote-test")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "--allow-remote" in out.stderr and host in out.stderr


def test_allow_remote_without_a_configured_key_is_refused(tmp_path):
    out = _serve(tmp_path, "--host", "0.0.0.0", "--allow-remote", key=None)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "$TINKER_API_KEY" in out.stderr and "key" in out.stderr


@pytest.mark.parametrize(
    ("host", "allow", "key", "refused"),
    [
        ("127.0.0.1", False, False, None),
        ("localhost", False, False, None),
        ("::1", False, False, None),
        ("127.0.0.2", False, False, None),
        ("0.0.0.0", False, True, "--allow-remote"),
        ("0.0.0.0", True, False, "API key"),
        ("0.0.0.0", True, True, None),
        ("", False, True, "--allow-remote"),
    ],
)
def test_the_bind_rule(host, allow, key, refused):
    from vlrl.errors import UsageError
    from vlrl.tinker.cli import check_bind

    if refused is None:
        check_bind(host, allow_remote=allow, key_configured=key, key_env="TINKER_API_KEY")
    else:
        with pytest.raises(UsageError, match=refused):
            check_bind(host, allow_remote=allow, key_configured=key, key_env="TINKER_API_KEY")


@pytest.fixture(scope="module")
def small():
    """A server with a 1 MiB body limit over a stub service: a request that got through would reach the stub."""
    from vlrl.tinker.server import serve_in_thread

    service = mock.MagicMock(name="service")
    service.create_session.return_value = {"type": "create_session", "session_id": "s"}
    running = serve_in_thread(service, host="127.0.0.1", port=0, max_body_bytes=LIMIT)
    yield running
    running.stop(close_service=False)


def test_a_chunked_body_over_the_limit_gets_413_before_the_server_reads_it_all(small):
    sent = 0
    total = 256 << 20  # 256 MiB offered; the server must stop long before

    def body():
        nonlocal sent
        while sent < total:  # bounded: at most 4,096 chunks
            sent += CHUNK
            yield b"x" * CHUNK

    with httpx.Client(base_url=small.url, headers={"X-API-Key": small.api_key}, timeout=30) as c:
        r = c.post("/api/v1/create_session", content=body(), headers={"Content-Type": "application/json"})
    # What the socket buffers take on loopback comes on top of the limit; nowhere near what was offered.
    print(f"chunked: the client wrote {sent >> 10} KiB of {total >> 20} MiB before the 413")
    assert sent < 32 << 20, f"the client wrote {sent >> 20} MiB before the server answered"
    assert r.status_code == 413 and "limit" in r.json()["detail"], r.text
    small.service.create_session.assert_not_called()


def test_a_declared_body_over_the_limit_gets_413_unread(small):
    sent = 0

    def body():
        nonlocal sent
        for _ in range(64):
            sent += CHUNK
            yield b"x" * CHUNK

    headers = {"Content-Type": "application/json", "Content-Length": str(64 * CHUNK)}
    with httpx.Client(base_url=small.url, headers={"X-API-Key": small.api_key}, timeout=30) as c:
        r = c.post("/api/v1/create_session", content=body(), headers=headers)
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    small.service.create_session.assert_not_called()


def test_a_body_under_the_limit_still_goes_through_chunked_or_not(small):
    payload = b'{"tags": [], "user_metadata": {}, "sdk_version": "x", "pad": "' + b"y" * (LIMIT // 2) + b'"}'
    with httpx.Client(base_url=small.url, headers={"X-API-Key": small.api_key}, timeout=30) as c:
        r = c.post("/api/v1/create_session", content=payload, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        pieces = iter([payload[:1000], payload[1000:]])
        r = c.post("/api/v1/create_session", content=pieces, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
    assert small.service.create_session.call_count == 2


def test_a_malformed_content_length_is_a_400_not_a_crash(small):
    import socket

    host, port = small.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: "
            + small.api_key.encode()
            + b"\r\nContent-Length: lots\r\n\r\n"
        )
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:80]
