"""Build a :class:`~vlrl.tinker.service.Service` for a checkpoint directory and serve it with uvicorn.

``--engine embedded``: the renderer and engine are vlrl's in-process ones (the engine holds its own copy
of the model, so sampling never waits on a training step's model). ``--engine vllm``: a vLLM server
started by ``vlrl.vllm.stack`` renders and samples; sampler weights reach it through its weight sync.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from vlrl.tinker.service import Service, ServiceConfig


def new_api_key() -> str:
    """A fresh key in the form the SDK accepts (``tml-`` prefix)."""
    return "tml-" + secrets.token_urlsafe(24)


def build_service(cfg: ServiceConfig, *, dtype: str = "float32", vllm: Any = None) -> Service:
    """Load the renderer, engine and base weights for ``cfg.base_model``. ``vllm``: a running
    ``vlrl.vllm.stack.VllmStack`` for that checkpoint to use (default: start one; closed with the service)."""
    import torch

    from vlrl.models.load import load_model, load_processor
    from vlrl.tinker.sampling import SamplerPool

    path = cfg.base_model
    torch_dtype = getattr(torch, dtype)
    processor = load_processor(path)
    tokenizer = processor.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    closer: Any = None
    if cfg.engine == "vllm":
        from vlrl.vllm.stack import vllm_stack

        stack = vllm
        if stack is None:
            stack = vllm_stack(path)
            closer = stack.close
        renderer: Any = stack.renderer
        base_model = load_model(path, dtype=torch_dtype)
        base = {n: p.detach() for n, p in base_model.named_parameters()}
        pool = SamplerPool(stack.engine, base, keep=cfg.keep_samplers)
    else:
        from vlrl.engines.embedded import EmbeddedEngine
        from vlrl.render.embedded import EmbeddedRenderer

        renderer = EmbeddedRenderer(processor)
        engine = EmbeddedEngine(load_model(path, dtype=torch_dtype), tokenizer)
        base_model = engine.model
        base = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        pool = SamplerPool(engine, base, keep=cfg.keep_samplers)
    service = Service(
        cfg,
        renderer=renderer,
        pool=pool,
        load_model=lambda: load_model(path, dtype=torch_dtype),
        pad_id=int(pad),
        max_context=int(pool.engine.max_context),
        vocab_size=int(base_model.get_output_embeddings().weight.shape[0]),
        on_close=closer,
    )
    return service


@dataclass
class Running:
    """A server running on a background thread (tests and notebooks): ``url``, ``api_key``, ``service``."""

    url: str
    api_key: str
    service: Service
    _server: Any
    _thread: threading.Thread

    def env(self) -> dict[str, str]:
        """The SDK's environment for this server."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self.api_key, "TINKER_TELEMETRY": "0"}

    def stop(self, *, close_service: bool = True) -> None:
        """Stop serving; ``close_service=False`` leaves the service running (another server may share it)."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if close_service:
            self.service.close()


def serve_in_thread(
    service: Service,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    max_body_bytes: int = 256 << 20,
) -> Running:
    """Start uvicorn for ``service`` on a thread; returns once it accepts connections."""
    import uvicorn

    from vlrl.tinker.app import build_app

    key = api_key or new_api_key()
    config = uvicorn.Config(
        build_app(service, key, max_body_bytes=max_body_bytes),
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="vlrl-tinker-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"tinker-serve did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return Running(f"http://{host}:{bound}", key, service, server, thread)


def serve_forever(service: Service, *, host: str, port: int, api_key: str, max_body_bytes: int) -> None:
    """Serve until interrupted (the CLI)."""
    import uvicorn

    from vlrl.tinker.app import build_app

    os.environ.setdefault("TINKER_TELEMETRY", "0")
    try:
        uvicorn.run(
            build_app(service, api_key, max_body_bytes=max_body_bytes),
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
        )
    finally:
        service.close()
