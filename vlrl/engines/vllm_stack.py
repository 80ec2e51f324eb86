"""One call from a checkpoint dir to a running vLLM server with its renderer and engine."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vlrl.engines.vllm import VllmEngine
    from vlrl.engines.vllm_server import VllmServer
    from vlrl.render.vllm import VllmRenderer


@dataclass(frozen=True)
class VllmStack:
    renderer: "VllmRenderer"
    engine: "VllmEngine"
    servers: tuple["VllmServer", ...]

    @property
    def url(self) -> str:
        return self.servers[0].url

    def close(self) -> None:
        self.engine.close()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> "VllmStack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def vllm_stack(model_dir: str | os.PathLike, *, n_servers: int = 1, **server_kwargs) -> VllmStack:
    """Start ``n_servers`` servers for ``model_dir`` (round-robin behind one client); renderer + engine on them."""
    from vlrl.engines.vllm import VllmEngine
    from vlrl.engines.vllm_client import VllmClient
    from vlrl.engines.vllm_server import ServerConfig, VllmServer
    from vlrl.render.vllm import VllmRenderer

    servers: list[VllmServer] = []
    try:
        for _ in range(n_servers):
            servers.append(VllmServer(ServerConfig(str(model_dir), **server_kwargs)).start())
    except BaseException:
        for s in servers:
            s.stop()
        raise
    cfg = servers[0].config
    client = VllmClient([s.url for s in servers])
    renderer = VllmRenderer.from_pretrained(model_dir, client, model=cfg.served_model_name)
    engine = VllmEngine.from_pretrained(model_dir, client, max_context=cfg.max_model_len, model=cfg.served_model_name)
    return VllmStack(renderer, engine, tuple(servers))
