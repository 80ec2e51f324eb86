"""One call from a checkpoint dir to running vLLM servers with their renderer and engine.

The renderer (``renderer=``, a run's ``rollout.renderer``):

- ``"embedded"`` (default): the checkpoint's HF processor in this process (``vlrl.render.embedded``, renders on
  threads), and the engine sends vLLM the prompt's own tensors (``vlrl.vllm.items``): each image crosses the wire
  once and the server processes none. At start one conversation is rendered both ways and held to
  ``vlrl.checks.render_agreement`` (ids, placeholders, grids, pixels in the server's dtype): a server whose
  processor or template differs stops the run there.
- ``"vllm"``: the server's render route (:class:`VllmRenderer`): the server processes each image and sends its
  tensors out and back in. Measured on an H100 (maze2d, bf16, 32 episodes of 12 turns): a step's rollout 21–22 s,
  against 6.6–7.4 s embedded (benchmarks/results/vllm_gpu_h100/NOTE.md, runs 15 and 20).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from vlrl.checks.render_agreement import RenderAgreement, check_render_agreement
from vlrl.render.types import Renderer
from vlrl.vllm.client import KEY_ENV, VllmClient
from vlrl.vllm.engine import VllmEngine
from vlrl.vllm.renderer import VllmRenderer
from vlrl.vllm.server import ServerConfig, VllmServer, new_api_key

ATTACH_ENV = "VLRL_VLLM_URL"
RendererChoice = Literal["embedded", "vllm"]
RENDER_WORKERS = 8
"""Threads the embedded renderer renders on (at most the machine's cores)."""


@dataclass(frozen=True)
class VllmStack:
    renderer: Renderer
    """What rollouts render with: the embedded renderer or ``server_renderer`` (module docstring)."""
    engine: VllmEngine
    servers: tuple[VllmServer, ...]
    config: ServerConfig
    """The servers' limits (``max_model_len``, ``max_images_per_prompt``, ...), resolved."""
    server_renderer: VllmRenderer
    """The servers' render route, whichever renderer rollouts use."""
    render_agreement: RenderAgreement | None = None
    """The start-up check of the embedded renderer against the server's (``None`` with ``renderer="vllm"``)."""

    @property
    def url(self) -> str:
        return self.engine.client.urls[0]

    def close(self) -> None:
        """Close the client; stop the servers this stack started (attached ones keep running)."""
        self.engine.close()
        for s in self.servers:
            s.stop()

    def __enter__(self) -> VllmStack:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def vllm_stack(
    model_dir: str | os.PathLike,
    *,
    max_images_per_prompt: int | None = None,
    max_model_len: int | None = None,
    kv_cache_gib: int | None = None,
    n_servers: int = 1,
    urls: str | list[str] | None = None,
    api_key: str | None = None,
    renderer: RendererChoice = "embedded",
    **server_kwargs,
) -> VllmStack:
    """Start ``n_servers`` servers for ``model_dir`` (round-robin behind one client); renderer + engine on them.

    Limits come from the run (``vlrl.vllm.limits``): ``max_model_len`` defaults to the model's
    ``max_position_embeddings`` (the embedded engine's context); ``max_images_per_prompt`` to every
    image that context can hold — pass ``episode_images(env, extras, max_turns)`` for a run's env. A
    limit that cannot fit raises ``VllmLimitError`` before anything starts.

    The servers get a fresh API key (``api_key`` to choose one) on every route but /health and
    /version (``vlrl.vllm.auth``); the stack's client sends it.

    ``urls`` (or ``$VLRL_VLLM_URL``, comma-separated) attaches to servers already running for
    ``model_dir`` (e.g. ``vlrl serve``) instead of starting any, with ``api_key`` or
    ``$VLRL_VLLM_API_KEY``; weight sync then reloads *those* servers, and closing the stack leaves
    them running. The limits given must then be the ones those servers were started with.

    ``renderer``: ``"embedded"`` or ``"vllm"`` (module docstring).
    """
    if urls is None and os.environ.get(ATTACH_ENV):
        urls = [u.strip() for u in os.environ[ATTACH_ENV].split(",") if u.strip()]
    if urls:
        api_key = api_key or os.environ.get(KEY_ENV)  # none: a 401 then says which variable to set
    cfg = ServerConfig(
        str(model_dir),
        max_model_len=max_model_len,
        max_images_per_prompt=max_images_per_prompt,
        kv_cache_gib=kv_cache_gib,
        api_key=api_key or new_api_key(),
        **server_kwargs,
    )
    servers = () if urls else _start(cfg, n_servers)
    client = VllmClient(urls or [s.url for s in servers], api_key=cfg.api_key)
    try:
        route = VllmRenderer.from_pretrained(model_dir, client, model=cfg.served_model_name)
        engine = VllmEngine.from_pretrained(
            model_dir, client, max_context=cfg.max_model_len, model=cfg.served_model_name, ban=cfg.ban
        )
        client.run(engine._check_ban())  # the form every server applies, known before any request body is built
        if renderer == "vllm":
            return VllmStack(route, engine, servers, cfg, route)
        if renderer != "embedded":
            raise ValueError(f"renderer must be 'embedded' or 'vllm', got {renderer!r}")
        local, agreement = embedded_renderer(model_dir, route, engine)
        return VllmStack(local, engine, servers, cfg, route, agreement)
    except BaseException:
        client.close()
        for s in servers:
            s.stop()
        raise


def embedded_renderer(model_dir, route: VllmRenderer, engine: VllmEngine):
    """The embedded renderer for ``engine``'s servers, checked against their render route on one conversation in
    the dtype the engine sends pixels in (its item layout, read now as the engine reads it on first need)."""
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.items import codec_probe

    local = EmbeddedRenderer.from_pretrained(model_dir, workers=min(RENDER_WORKERS, os.cpu_count() or 1))
    codec = engine.client.run(engine._codec())  # the one place the layout is read
    return local, check_render_agreement(local, route, codec_probe(), pixel_dtype=codec.pixel_dtype)


def _start(cfg: ServerConfig, n: int) -> tuple[VllmServer, ...]:
    """Launch ``n`` servers side by side, then wait for each; on any failure stop them all."""
    servers: list[VllmServer] = []
    try:
        for _ in range(n):
            servers.append(VllmServer(cfg).launch())
        for s in servers:
            s.wait_ready()
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return tuple(servers)


def rollout_stack(
    model_dir,
    *,
    mode: Literal["server", "inprocess"] = "server",
    renderer: RendererChoice,
    logprobs_from: Literal["auto", "vllm", "sampler"] = "auto",
    ban: Literal["auto", "processor", "bad_words"] = "auto",
    **kwargs,
):
    """``(renderer, engine, close)`` for a run's rollouts (``rollout.vllm_mode``): :func:`vllm_stack`'s servers, or
    the in-process engine (``vlrl.vllm.inprocess``) with the embedded renderer held to vLLM's own at start, as here.
    ``logprobs_from`` / ``ban``: ``rollout.vllm_logprobs`` / ``rollout.vllm_ban`` (``auto``: in process the sampler;
    from a server vLLM's report; the ban as bad words where vLLM then runs its model runner V2 in process, the
    processor on servers).
    ``kwargs``: ``ServerConfig``'s (limits, dtype, execution)."""
    if mode == "server" and logprobs_from == "sampler":
        raise ValueError("rollout.vllm_logprobs='sampler' needs rollout.vllm_mode=inprocess")
    if mode == "server":
        # auto: the processor, until a server on vLLM's model runner V2 (where auto would leave it out) runs on a GPU
        stack = vllm_stack(model_dir, renderer=renderer, ban="processor" if ban == "auto" else ban, **kwargs)
        return stack.renderer, stack.engine, stack.close
    if mode != "inprocess":
        raise ValueError(f"rollout.vllm_mode must be 'server' or 'inprocess', got {mode!r}")
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.inprocess import InprocessVllmEngine
    from vlrl.vllm.items import codec_probe

    engine = InprocessVllmEngine(
        ServerConfig(str(model_dir), **kwargs),
        logprobs_from="vllm" if logprobs_from == "vllm" else "sampler",
        ban=ban,
    )
    try:
        if renderer == "vllm":
            return engine.renderer, engine, engine.close
        local = EmbeddedRenderer.from_pretrained(model_dir, workers=min(RENDER_WORKERS, os.cpu_count() or 1))
        check_render_agreement(local, engine.renderer, codec_probe(), pixel_dtype=engine.codec.pixel_dtype)
        return local, engine, engine.close
    except BaseException:
        engine.close()
        raise
