"""The embedded inference engine: an in-process transformers Qwen-VL model (CPU or CUDA).

Requests from any thread or coroutine are queued; a worker thread takes what is queued (up to ``max_batch``,
waiting briefly for concurrent episodes' turns: :meth:`EmbeddedEngine._next_batch`) and decodes it as one
left-padded batch with a KV cache, dropping rows as they finish; on CUDA each decode step is one CUDA graph replay
(``vlrl.engines.graphs``; the eager steps are ``vlrl.engines.steps``). One :meth:`EmbeddedEngine.generate` call is one
unit, so its prompts share one batch (what ``vlrl.checks.batch_invariance`` relies on). Positions are explicit
mRoPE ids from the image grids (``vlrl.models.positions``), the trainer's function. Vision placeholder ids are
never sampled. New weights arrive in memory between batches.

**Reuse** (``vlrl.engines.reuse``): image features are cached by content hash, and a finished request's
keys / values stay cached by token prefix, so a multi-turn turn prefills only what is new since its previous
turn and encodes only its new images. The batch is laid out as without reuse (left-padded ``[B, W]``, same
mask and positions); only its first ``W - S`` columns come from the cache, ``S`` the longest part any row
must recompute (a row with nothing cached makes it the whole batch: then nothing is reused).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Literal

import torch

from vlrl.engines import reuse
from vlrl.engines.graphs import DecodeGraphs, unsupported
from vlrl.engines.requests import DecodeRequest
from vlrl.engines.sampling import (
    CounterDraws,
    check_race,
    contract_logprobs,
    effective_temperature,
    fp32_head,
    on_device,
    raise_if_unsampled,
    request_generator,
    request_seed,
    sample_tokens,
    top_k,
    top_pairs,
)
from vlrl.engines.steps import DynamicSteps, Steps, to_host
from vlrl.engines.types import Engine, Generation, NamedTensors, SamplingParams
from vlrl.models.positions import mrope_positions
from vlrl.models.tokenizer import VISION_TOKENS
from vlrl.render.types import RenderedPrompt


class _Unit(list):
    """Requests queued together: one ``submit`` (``waits``: its batch may wait for more) or one ``generate`` call."""

    def __init__(self, requests: Sequence[DecodeRequest], waits: bool):
        super().__init__(requests)
        self.waits = waits


_STOP = _Unit([], waits=False)  # queued by close(): the worker stops once the units before it are done


class EmbeddedEngine:
    """Token-in/token-out generation with honest logprobs (see the contract in ``engines.types``)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch: int = 64,
        max_context: int | None = None,
        image_cache_bytes: int = 256 << 20,
        prefix_cache_bytes: int = 1 << 30,
        gather_s: float = 0.03,
        gather_cap_s: float = 0.25,
        pipelined: bool | None = None,
        race: Literal["generator", "counter"] = "generator",
        graphs: bool | None = None,
        graph_bytes: int = 8 << 30,
    ):
        """``gather_s``: how long a batch that is not full waits for one more request before it starts (each
        arrival waits again), at most ``gather_cap_s`` in all (see :meth:`_next_batch`); 0 starts at once. 30 ms
        because 10 ms let the turns split again on a slowed H100 host (``benchmarks/results/engine_gather/``).
        ``pipelined``: decode steps queued ahead of the host's reads (:meth:`_decode`); None: on CUDA only (a CPU
        computes as it is asked, so there it would only add a forward at a batch's last step). ``race``: each request's
        sampling noise from its own ``torch.Generator`` (one call per row a step), or from counters in one kernel for
        the batch (``vlrl.engines.race_kernel``, Triton: other tokens for a seed, the same distribution).
        ``graphs``: decode steps as CUDA graph replays over preallocated keys / values of at most ``graph_bytes``
        (``vlrl.engines.graphs``; a larger batch steps eagerly); None: on CUDA where the model allows them
        (``graphs.unsupported``); True on a CPU runs the same static steps eagerly."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.gather_s, self.gather_cap_s, self.pipelined, self.race = gather_s, gather_cap_s, pipelined, race
        check_race(race, self.device)
        self.max_context = max_context or int(model.config.text_config.max_position_embeddings)
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        eos = gen_eos if gen_eos is not None else tokenizer.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.banned_ids = torch.tensor([tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS], dtype=torch.long)
        self.weight_version = 0
        self._lock = threading.Lock()  # held while a batch runs or weights change
        self._queue: queue.Queue[_Unit] = queue.Queue()  # units: one submit or one generate call
        self._held: _Unit | None = None  # a unit that did not fit the last batch: first in the next
        self._worker: threading.Thread | None = None
        self._vision = reuse.VisionCache(image_cache_bytes)  # on the model's device: 0 bytes turns it off
        self._prefix = reuse.PrefixCache(prefix_cache_bytes)
        self._fingerprint: int | None = None
        why_not = unsupported(model.model.language_model)
        if graphs is None:
            graphs = self.device.type == "cuda" and why_not is None
        elif graphs and why_not is not None:
            raise ValueError(f"graphs=True: {why_not}")
        self._graphs = DecodeGraphs(graph_bytes) if graphs else None
        self.stats = {"images_encoded": 0, "prefill_columns": 0, "reused_columns": 0, "decode_s": 0.0}
        """Counters since the engine was made; ``decode_s``: seconds its worker spent decoding batches (the rest of
        a rollout's time is host work around it: renders, env steps, waits for requests)."""

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str = "cpu", dtype=None, attention: str | None = None, **kwargs
    ) -> EmbeddedEngine:
        from vlrl.models.load import load_model, load_processor

        model = load_model(path, dtype=dtype, device=device, attention=attention)
        return cls(model, load_processor(path).tokenizer, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ requests

    def submit(self, prompt: RenderedPrompt, params: SamplingParams) -> Future:
        """Queue one request; the future resolves to a :class:`Generation` (or the error).
        Cancelling the future before its batch starts drops the request."""
        request = self._request(prompt, params)
        self._enqueue(_Unit([request], waits=True))
        return request.future

    def generate(
        self, prompts: Sequence[RenderedPrompt], params: SamplingParams | Sequence[SamplingParams] = SamplingParams()
    ) -> list[Generation]:
        """Generate for every prompt, decoded together as one batch (``max_batch`` rows at a time);
        results in prompt order."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        requests = [self._request(p, sp) for p, sp in zip(prompts, params)]
        for start in range(0, len(requests), self.max_batch):
            self._enqueue(_Unit(requests[start : start + self.max_batch], waits=False))
        return [r.future.result() for r in requests]

    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams = SamplingParams()) -> Generation:
        return await asyncio.wrap_future(self.submit(prompt, params))

    def _request(self, prompt: RenderedPrompt, params: SamplingParams) -> DecodeRequest:
        return DecodeRequest.checked(prompt, params, self.max_context, set(self.banned_ids.tolist()))

    # ------------------------------------------------------------------ worker

    def _enqueue(self, unit: _Unit) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._serve, name="vlrl-embedded-engine", daemon=True)
            self._worker.start()
        self._queue.put(unit)

    def _next_batch(self) -> list[DecodeRequest] | None:
        """Block for one unit, then add whole queued units in order while they fit ``max_batch`` (the first that does
        not fit opens the next batch); cancelled requests are dropped here, never decoded. None at :meth:`close`.

        A ``submit``'s batch that is not full waits ``gather_s`` after each arrival for one more unit, ``gather_cap_s``
        in all (a ``generate`` call's batch starts at once): concurrent episodes queue their turns ms apart, and
        without the wait each turn's first request decoded alone (8 maze episodes on an H100: a 16-turn rollout took
        47.3 s, 20.1 s with the wait, ``benchmarks/engine_gather.py``). Batch composition changes no logprob (batch
        invariance) and no sampled token (each request draws from its own generator)."""
        units = [self._held if self._held is not None else self._queue.get()]
        self._held = None
        if units[0] is _STOP:
            return None
        size = len(units[0])
        cap = time.monotonic() + (self.gather_cap_s if units[0].waits else 0.0)
        while size < self.max_batch:
            wait = min(self.gather_s, cap - time.monotonic())
            try:
                unit = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if unit is _STOP or size + len(unit) > self.max_batch:
                self._held = unit
                break
            units.append(unit)
            size += len(unit)
        return [r for unit in units for r in unit if r.future.set_running_or_notify_cancel()]

    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            if not batch:
                continue
            try:
                t = time.perf_counter()
                with self._lock:
                    self._decode(batch)
                self.stats["decode_s"] += time.perf_counter() - t
                for r in batch:
                    r.future.set_result(r.finish)
            except BaseException as exc:  # noqa: BLE001 — the batch's callers get the error; the worker keeps serving
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)

    def close(self) -> None:
        """Finish what is queued, stop the worker thread (it holds this engine: model, caches, graphs, for as long
        as it runs) and drop the caches. A later request starts a new worker."""
        worker, self._worker = self._worker, None
        if worker is not None and worker.is_alive():
            self._queue.put(_STOP)
            worker.join()
        self.clear_caches()
        if self._graphs is not None:
            self._graphs.clear()

    # ------------------------------------------------------------------ decoding

    @torch.no_grad()
    def _decode(self, requests: list[DecodeRequest]) -> None:
        """Run ``requests`` to completion as one batch: a left-padded prefill (from the cached prefix on), then
        one token per step with a KV cache; finished rows leave the batch and the cache (their keys / values
        stay in the prefix cache). Logits come from the decoder's last hidden state through the LM head in
        fp32 (``fp32_logits``, as the trainer).

        ``pipelined`` (CUDA by default): a step's next forward is queued before the host reads the step's tokens
        (``to_host`` waits for their copies only), so the host's stop checks run while the device computes. A row
        the step finishes was fed its last token too (unless every row ends there): that output is dropped with the
        row; the other rows' tokens are those of the step-by-step order, up to batch invariance."""
        device = self.device
        self._check_weights()
        head = fp32_head(self.model.get_output_embeddings())  # cast once per batch, not once per step
        logits, steps = self._prefill(requests, head)
        active = list(range(len(requests)))  # request index of each batch row
        seeds = [request_seed(r.params) for r in requests] if self.race == "counter" else None
        gens = [request_generator(r.params, device) for r in requests] if seeds is None else []
        # On the device once: a CPU tensor moved in the loop is a pageable copy, which syncs the stream each step.
        temps = torch.tensor([effective_temperature(r.params.temperature) for r in requests], device=device)
        banned = self.banned_ids.to(device)
        ahead = self.pipelined if self.pipelined is not None else device.type == "cuda"
        stop = dict(tokenizer=self.tokenizer, eos_ids=self.eos_ids, version=self.weight_version)  # fixed: lock held
        while True:
            rows = [requests[i] for i in active]
            ks = [r.params.logprobs_topk for r in rows]
            own = (
                [gens[i] for i in active]
                if seeds is None
                else CounterDraws([seeds[i] for i in active], [len(r.sampled) for r in rows])
            )
            tokens = sample_tokens(logits, [r.params for r in rows], banned, own, check=False)
            contract = contract_logprobs(logits, temps, banned)
            lps = contract.gather(1, tokens.clamp(min=0)[:, None])[:, 0]
            read = to_host(tokens, lps, *(top_k(contract, ks) or ()))
            fed = ahead and any(len(r.ids) + 1 < r.max_new for r in rows)  # else every row ends at this token
            if fed:  # an unsampled row (-1) raises below, after this forward
                logits = steps.forward(tokens.clamp(min=0))
            picked, lp_list, *top = read()
            raise_if_unsampled(picked, range(len(picked)))
            tops = top_pairs((top[0], top[1]) if top else None, ks)
            on = [requests[i].record(*step, **stop) for i, step in zip(active, zip(picked, lp_list, tops, strict=True))]
            keep = [row for row, going in enumerate(on) if going]
            self._remember([(requests[active[row]], row) for row, going in enumerate(on) if not going], steps, fed)
            if not keep:
                return
            if len(keep) < len(active):  # drop finished rows from the batch and the cache
                steps.keep(keep)
                idx = on_device(keep, device)
                temps = temps[idx]
                logits, tokens = (logits[idx], tokens) if fed else (logits, tokens[idx])  # fed: the new logits
                active = [active[k] for k in keep]
            if not fed:
                logits = steps.forward(tokens)

    def _prefill(self, requests: list[DecodeRequest], head) -> tuple[torch.Tensor, Steps]:
        """The batch's prompts through the decoder (from the cached prefix on) -> the first logits ``[B, V]`` fp32
        and the decode steps that follow (:mod:`vlrl.engines.steps`: a CUDA graph a step where ``graphs``)."""
        model = self.model
        inputs = self._prefill_inputs(requests)
        attn = inputs["attention_mask"]
        positions = mrope_positions(model, inputs["input_ids"], attn, inputs["image_grid_thw"])
        next_pos = positions.amax(dim=(0, 2)) + 1  # [B]: text after the prompt continues on all three axes
        cache, start = self._cached_prefix(requests, attn.shape[1])
        embeds, extra = self._new_embeddings(requests, inputs["input_ids"], start)
        lm = model.model.language_model
        hidden = lm(
            inputs_embeds=embeds,
            attention_mask=attn,
            position_ids=positions[:, :, start:],
            past_key_values=cache,
            use_cache=True,
            **extra,
        ).last_hidden_state
        steps = None
        if self._graphs is not None:
            columns = attn.shape[1] + max(r.max_new for r in requests)
            steps = self._graphs.steps(model, head, cache, attn, next_pos, columns)
        return head(hidden[:, -1]), steps or DynamicSteps(model, head, cache, attn, next_pos)

    def _prefill_inputs(self, requests: list[DecodeRequest]) -> dict:
        """Left-padded ``input_ids`` / ``attention_mask`` ``[B, L]`` and the batch's ``image_grid_thw``."""
        width = max(len(r.prompt.token_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for b, r in enumerate(requests):
            n = len(r.prompt.token_ids)
            ids[b, width - n :] = torch.tensor(r.prompt.token_ids, dtype=torch.long)
            mask[b, width - n :] = 1
        grids = [r.prompt.vision()[1] for r in requests if r.prompt.n_images]
        return {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "image_grid_thw": torch.cat(grids).to(self.device) if grids else None,
        }

    # ------------------------------------------------------------------ reuse (vlrl.engines.reuse)

    def clear_caches(self) -> None:
        """Forget every cached image feature and prefix (a benchmark's cold start)."""
        with self._lock:
            self._vision.clear()
            self._prefix.clear()

    def _check_weights(self) -> None:
        """Cached features and keys / values hold for the weights that computed them: any change clears them."""
        fingerprint = reuse.weights_fingerprint(self.model)
        if fingerprint != self._fingerprint:
            self._vision.clear()
            self._prefix.clear()
            self._fingerprint = fingerprint

    def _cached_prefix(self, requests: list[DecodeRequest], width: int):
        cache, start, recompute = reuse.cached_prefix(self._prefix, self.model, [r.prompt for r in requests], width)
        self.stats["prefill_columns"] += recompute * len(requests)
        self.stats["reused_columns"] += start * len(requests)
        return cache, start

    def _new_embeddings(
        self, requests: list[DecodeRequest], ids: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, dict]:
        before = self._vision.encoded
        out = reuse.new_embeddings(self._vision, self.model, [r.prompt for r in requests], ids, start)
        self.stats["images_encoded"] += self._vision.encoded - before
        return out

    def _remember(self, finished: list[tuple[DecodeRequest, int]], steps: Steps, fed: bool) -> None:
        """Keep finished rows' keys / values (each prompt and every generated token fed back) in the prefix cache;
        ``finished``: (request, batch row) pairs; ``fed``: whether the last sampled token was fed (see _decode)."""
        if self._prefix.enabled and finished:
            last = None if fed else -1
            cache, rows = steps.kv_rows([row for _, row in finished])
            pairs = zip(finished, rows, strict=True)
            for entry in reuse.prefix_entries([(r.prompt, r.sampled[:last], row) for (r, _), row in pairs], cache):
                self._prefix.add(entry)

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def update_weights(self, named_tensors: NamedTensors, version: int | None = None) -> int:
        """Copy new weights into the model in place (between batches); returns the new weight version. Names are
        the model's ``named_parameters()`` names; every name must exist with the same shape."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        with self._lock:
            params = dict(self.model.named_parameters())
            for name, tensor in items:
                if name not in params:
                    raise KeyError(f"update_weights: the engine's model has no parameter {name!r}")
                if params[name].shape != tensor.shape:
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(params[name].shape)}, got {tuple(tensor.shape)}"
                    )
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
            self.weight_version = self.weight_version + 1 if version is None else version
            return self.weight_version

    def weights_checksum(self) -> str:
        """sha256 over every parameter's name and bytes (to verify a weight sync)."""
        from vlrl.models.checksum import weights_checksum

        with self._lock:
            return weights_checksum(self.model.named_parameters())


if TYPE_CHECKING:  # mypy proves here that the class implements the contract
    _engine: type[Engine] = EmbeddedEngine
