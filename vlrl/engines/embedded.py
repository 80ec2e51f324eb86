"""The embedded inference engine: an in-process transformers Qwen-VL model (CPU or CUDA).

Requests from any thread or coroutine are queued; a worker thread takes everything queued (up to
``max_batch``) and decodes it as one left-padded batch with a KV cache, dropping rows from the
batch as they finish. Positions are explicit mRoPE ids from the image grids
(``vlrl.models.positions``), the same function the trainer uses. Vision placeholder ids are never
sampled. New weights arrive in memory between batches (:meth:`update_weights`).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from vlrl.engines.decode import Request, decode_batch
from vlrl.engines.types import Generation, SamplingParams
from vlrl.errors import ContextOverflowError
from vlrl.models.tokenizer import VISION_TOKENS
from vlrl.render.types import RenderedPrompt


@dataclass
class _Job:
    request: Request
    future: Future


class EmbeddedEngine:
    """Token-in/token-out generation with honest logprobs (see the contract in ``engines.types``)."""

    def __init__(self, model, tokenizer, *, max_batch: int = 64, max_context: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.max_context = max_context or int(model.config.text_config.max_position_embeddings)
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        eos = gen_eos if gen_eos is not None else tokenizer.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.banned_ids = torch.tensor([tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS], dtype=torch.long)
        self.weight_version = 0
        self._lock = threading.Lock()  # held while a batch runs or weights change
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: str = "cpu", dtype=None, **kwargs) -> "EmbeddedEngine":
        from vlrl.models.load import load_model, load_processor

        return cls(load_model(path, dtype=dtype, device=device), load_processor(path).tokenizer, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ requests

    def submit(self, prompt: RenderedPrompt, params: SamplingParams) -> Future:
        """Queue one request; the future resolves to a :class:`Generation` (or the error)."""
        request = self._request(prompt, params)
        future: Future = Future()
        self._ensure_worker()
        self._queue.put(_Job(request, future))
        return future

    def generate(self, prompts: Sequence[RenderedPrompt],
                 params: SamplingParams | Sequence[SamplingParams] = SamplingParams()) -> list[Generation]:
        """Generate for every prompt (batched together); results in prompt order."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        futures = [self.submit(p, sp) for p, sp in zip(prompts, params)]
        return [f.result() for f in futures]

    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams = SamplingParams()) -> Generation:
        return await asyncio.wrap_future(self.submit(prompt, params))

    def _request(self, prompt: RenderedPrompt, params: SamplingParams) -> Request:
        n = len(prompt.token_ids)
        if n == 0:
            raise ValueError("empty prompt")
        if n >= self.max_context:
            raise ContextOverflowError(n, self.max_context)
        banned = set(self.banned_ids.tolist())
        bad = banned.intersection(params.stop_token_ids)
        if bad:
            raise ValueError(f"stop_token_ids {sorted(bad)} are vision placeholder ids, which are never sampled")
        return Request(prompt=prompt, params=params, max_new=min(params.max_tokens, self.max_context - n))

    # ------------------------------------------------------------------ worker

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._serve, name="vlrl-embedded-engine", daemon=True)
            self._worker.start()

    def _serve(self) -> None:
        while True:
            jobs = [self._queue.get()]
            while len(jobs) < self.max_batch:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                with self._lock:
                    results = decode_batch(self, [j.request for j in jobs])
                for job, res in zip(jobs, results):
                    job.future.set_result(res)
            except BaseException as exc:  # the callers get the error; the worker keeps serving
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | dict,
                       version: int | None = None) -> int:
        """Copy new weights into the model in place (between batches); returns the new weight version.

        Names are the model's ``named_parameters()`` names; every name must exist with the same shape.
        """
        items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
        with self._lock:
            params = dict(self.model.named_parameters())
            for name, tensor in items:
                if name not in params:
                    raise KeyError(f"update_weights: the engine's model has no parameter {name!r}")
                if params[name].shape != tensor.shape:
                    raise ValueError(f"update_weights: {name} has shape {tuple(params[name].shape)}, "
                                     f"got {tuple(tensor.shape)}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
            self.weight_version = self.weight_version + 1 if version is None else version
            return self.weight_version

    def weights_checksum(self) -> str:
        """sha256 over every parameter's name and bytes (to verify a weight sync)."""
        from vlrl.models.checksum import weights_checksum

        with self._lock:
            return weights_checksum(self.model.named_parameters())
