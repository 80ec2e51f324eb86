"""Start, watch and stop one vLLM OpenAI server (a subprocess) for a checkpoint directory.

How it is started (flags, environment, limits, the execution mode) is :class:`vlrl.vllm.config.ServerConfig`'s;
this module runs the process: launch, health wait, log tail, stop (its whole session), and never an orphan.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from vlrl.vllm.config import (
    API_KEY_ENV,
    AUTH_MIDDLEWARE,
    BAN_KEY,
    BAN_PROCESSOR,
    EXECUTION_FLAGS,
    LOGPROBS_MODE,
    STARTUP_TIMEOUT_ENV,
    WORKER_EXTENSION,
    Execution,
    ServerConfig,
    VllmServerError,
    new_api_key,
)

__all__ = [  # the config's names stay importable from here, where the rest of vlrl has always found them
    "API_KEY_ENV",
    "AUTH_MIDDLEWARE",
    "BAN_KEY",
    "BAN_PROCESSOR",
    "EXECUTION_FLAGS",
    "LOGPROBS_MODE",
    "WORKER_EXTENSION",
    "Execution",
    "ServerConfig",
    "VllmServer",
    "VllmServerError",
    "free_port",
    "new_api_key",
]


def _die_with_parent() -> None:
    """In the child: SIGKILL when the starting thread's process dies (no orphaned servers after a crash)."""
    if sys.platform.startswith("linux"):
        import ctypes

        # PR_SET_PDEATHSIG = 1; SIGKILL because SIGTERM is ignored while vLLM starts
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VllmServer:
    """One running server. ``with VllmServer(ServerConfig(dir)) as s: s.url`` (started and healthy)."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise VllmServerError("server not started")
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> VllmServer:
        """Launch the subprocess and wait until ``/health`` answers 200 (or raise with the log tail)."""
        return self.launch().wait_ready()

    def launch(self) -> VllmServer:
        """Start the subprocess without waiting (several servers can then start side by side)."""
        cfg = self.config
        self.port = cfg.port or free_port(cfg.host)
        logs = cfg.cache_root() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(cfg.log_path) if cfg.log_path else logs / f"server-{self.port}.log"
        self._t0 = time.monotonic()
        caps = cfg.capabilities()
        with open(self.log_path, "wb") as log:
            # own session: stop() signals the server and anything it spawned, nothing else
            self.proc = subprocess.Popen(
                cfg.argv(self.port, caps),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=cfg.env(caps),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    def wait_ready(self) -> VllmServer:
        """Wait for ``/health`` after :meth:`launch`; stops the server and raises if it dies or times out."""
        try:
            self._wait_healthy(self._t0 + self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - self._t0
        return self

    def _wait_healthy(self, deadline: float) -> None:
        proc = self.proc
        if proc is None:
            raise VllmServerError("wait_ready() before launch(): no server process to wait for")
        while True:
            if proc.poll() is not None:
                raise VllmServerError(
                    f"vLLM server for {self.config.model_dir} exited with code "
                    f"{proc.returncode} while starting; log {self.log_path}:\n{self.log_tail()}"
                )
            if self.healthy(timeout=2.0):
                return
            if time.monotonic() > deadline:
                raise VllmServerError(
                    f"vLLM server at {self.url} not healthy after "
                    f"{self.config.startup_timeout_s:.0f} s (ServerConfig.startup_timeout_s, ${STARTUP_TIMEOUT_ENV}); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_chars: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-n_chars:]
        return data.decode("utf-8", "replace")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL if it has not exited within ``timeout_s``."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL at once (tests of a dying server)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> VllmServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort: never leave an orphaned server behind
        try:
            self.stop(timeout_s=2.0)
        except Exception:  # noqa: BLE001 — __del__ must not raise (interpreter shutdown)
            pass
