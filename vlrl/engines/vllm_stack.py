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
        return self.engine.client.urls[0]

    def close(self) -> None:
        """Close the client; stop the servers this stack started (attached ones keep running)."""
        self.engine.close()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> "VllmStack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ATTACH_ENV = "VLRL_VLLM_URL"


def vllm_stack(model_dir: str | os.PathLike, *, n_servers: int = 1, urls: str | list[str] | None = None,
               **server_kwargs) -> VllmStack:
    """Start ``n_servers`` servers for ``model_dir`` (round-robin behind one client); renderer + engine on them.

    ``urls`` (or ``$VLRL_VLLM_URL``, comma-separated) attaches to servers already running for
    ``model_dir`` (e.g. ``vlrl serve``) instead of starting any; weight sync then reloads *those*
    servers, and closing the stack leaves them running.
    """
    from vlrl.engines.vllm import VllmEngine
    from vlrl.engines.vllm_client import VllmClient
    from vlrl.engines.vllm_server import ServerConfig, VllmServer
    from vlrl.render.vllm import VllmRenderer

    if urls is None and os.environ.get(ATTACH_ENV):
        urls = [u.strip() for u in os.environ[ATTACH_ENV].split(",") if u.strip()]
    servers: list[VllmServer] = []
    if urls:
        cfg = ServerConfig(str(model_dir), **server_kwargs)
        client = VllmClient(urls)
    else:
        try:  # launched side by side, then each waited for
            for _ in range(n_servers):
                servers.append(VllmServer(ServerConfig(str(model_dir), **server_kwargs)).launch())
            for s in servers:
                s.wait_ready()
        except BaseException:
            for s in servers:
                s.stop()
            raise
        cfg = servers[0].config
        client = VllmClient([s.url for s in servers])
    renderer = VllmRenderer.from_pretrained(model_dir, client, model=cfg.served_model_name)
    engine = VllmEngine.from_pretrained(model_dir, client, max_context=cfg.max_model_len, model=cfg.served_model_name)
    return VllmStack(renderer, engine, tuple(servers))
