"""``vlrl tinker-serve`` as a command: it serves on loopback with the key from the environment, and refuses a
missing checkpoint or a key the SDK would not send, in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
from tinker_helpers import ARCH


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vlrl(*args: str, key: str) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "vlrl", "tinker-serve", *args], {**os.environ, "TINKER_API_KEY": key}


def test_tinker_serve_serves_on_loopback_with_the_key(vlrl_model_dir):
    port = _free_port()
    cmd, env = _vlrl(
        "--base-model", str(vlrl_model_dir(ARCH)), "--model-name", "tiny", "--port", str(port), key="tml-cli-test"
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "tinker-serve did not come up"
            time.sleep(0.2)
        assert httpx.get(f"{url}/get_server_capabilities").status_code == 401
        caps = httpx.get(f"{url}/get_server_capabilities", headers={"X-API-Key": "tml-cli-test"}).json()
        assert caps["supported_models"][0]["model_name"] == "tiny"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "TINKER_API_KEY=" not in proc.stdout.read()  # a key from the environment is never printed


def test_tinker_serve_refuses_in_one_line(tmp_path, vlrl_model_dir):
    cmd, env = _vlrl("--base-model", str(tmp_path / "missing"), key="tml-x")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "no such checkpoint directory" in out.stderr
    cmd, env = _vlrl("--base-model", str(vlrl_model_dir(ARCH)), key="sk-not-tinker")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "must start with 'tml-'" in out.stderr and out.stderr.count("\n") == 1
