"""The Tinker API's state and operations, independent of HTTP (``vlrl.tinker.app`` maps routes onto these).

Sessions, training models (``model_id = "{session_id}:train:{model_seq_id}"``, the id the SDK derives
itself), sampling sessions (each bound to one set of sampler weights) and the future table. A request
that is malformed or names something unknown raises :class:`BadInputError` at once (HTTP 400, which
the SDK does not retry); work that runs (forward/backward, optimizer steps, saving, sampling) is queued
and answered through ``retrieve_future``, where a failure arrives as the SDK's ``RequestFailedError``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from vlrl.errors import BadInputError
from vlrl.tinker.futures import FutureTable, Json, Outcome, Proto, UnknownIdError
from vlrl.tinker.inputs import ImageRenderer, InputLimits, render_chunks
from vlrl.tinker.losses import TINKER_LOSSES
from vlrl.tinker.sampling import BASE, SamplerPool, sample_spec
from vlrl.tinker.training import AdamStep, LoraSpec, TrainedModel
from vlrl.tinker.wire import (
    ForwardBackwardCall,
    chunks_from_json,
    encode_forward_backward_output,
    encode_sample_response,
)


@dataclass(frozen=True)
class ServiceConfig:
    """What one server serves and its limits."""

    base_model: str
    """The checkpoint directory."""
    model_name: str
    """The name clients pass as ``base_model`` (the directory path is accepted too)."""
    engine: Literal["embedded", "vllm"] = "embedded"
    lr_scale: dict[str, float] = field(default_factory=dict)
    max_samples: int = 64
    default_max_tokens: int = 256
    max_images: int = 64
    micro_batch_size: int = 16
    long_poll_s: float = 10.0
    """``retrieve_future`` waits up to this long for a result before answering try_again."""
    keep_samplers: int = 8


class Service:
    """Everything behind the routes. ``load_model()`` gives a fresh trainable copy of the base model."""

    def __init__(
        self,
        cfg: ServiceConfig,
        *,
        renderer: ImageRenderer,
        pool: SamplerPool,
        load_model: Callable[[], Any],
        pad_id: int,
        max_context: int,
        vocab_size: int | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        self.cfg, self.renderer, self.pool, self.on_close = cfg, renderer, pool, on_close
        self.load_model, self.pad_id = load_model, pad_id
        self.limits = InputLimits(max_tokens=max_context, max_images=cfg.max_images, vocab_size=vocab_size)
        self.futures = FutureTable()
        self.models: dict[str, TrainedModel] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.sampling_sessions: dict[str, str] = {}  # sampling session id -> sampler weights key
        self._lock = threading.Lock()
        self._train = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self._sample = ThreadPoolExecutor(32, thread_name_prefix="tinker-sample")

    def close(self) -> None:
        self._train.shutdown(wait=False, cancel_futures=True)
        self._sample.shutdown(wait=False, cancel_futures=True)
        if self.on_close is not None:
            self.on_close()

    # ------------------------------------------------------------------ sessions and info

    def capabilities(self) -> dict:
        return {
            "supported_models": [
                {
                    "model_name": self.cfg.model_name,
                    "max_context_length": self.limits.max_tokens,
                    "trainable": True,
                    "sampleable": True,
                }
            ]
        }

    def create_session(self, body: dict) -> dict:
        sid = f"session-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self.sessions[sid] = {"tags": body.get("tags") or [], "sdk_version": body.get("sdk_version")}
        return {"type": "create_session", "session_id": sid}

    def finish_session(self, session_id: str, body: dict) -> None:
        """``POST /sessions/{id}/finish`` (the SDK's ``ServiceClient.close``): the session ends with the reason it
        gives (the first one stays); its models and samplers live on, no new model joins it."""
        reason = body.get("reason")
        reason = reason if isinstance(reason, dict) else {}
        with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                raise UnknownIdError(f"unknown session_id {session_id!r}")
            session.setdefault("finished", {"reason": reason.get("type"), "detail": body.get("detail")})

    def _check_base(self, name: str | None) -> None:
        if name is not None and name not in (self.cfg.model_name, self.cfg.base_model):
            raise BadInputError(f"base_model {name!r} is not served here; this server serves {self.cfg.model_name!r}")

    def _model(self, model_id: str) -> TrainedModel:
        try:
            return self.models[model_id]
        except KeyError:
            raise BadInputError(f"unknown model_id {model_id!r} (create a training client first)") from None

    def get_info(self, body: dict) -> dict:
        m = self._model(str(body.get("model_id")))
        return {
            "type": "get_info",
            "model_id": body["model_id"],
            "is_lora": m.lora is not None,
            "lora_rank": m.lora.rank if m.lora else None,
            "model_name": self.cfg.model_name,
            "model_data": {"arch": "qwen_vl", "model_name": self.cfg.model_name, "tokenizer_id": self.cfg.base_model},
        }

    # ------------------------------------------------------------------ training

    def create_model(self, body: dict) -> dict:
        """LoRA when ``lora_config.rank > 0``; full fine-tuning without ``lora_config`` or with rank 0
        (SDK 0.38 has no other full fine-tuning call: ``create_lora_training_client(base, rank=0)``)."""
        self._check_base(body.get("base_model"))
        session = self.sessions.get(str(body.get("session_id")))
        if session is None:
            raise BadInputError(f"unknown session_id {body.get('session_id')!r}")
        if "finished" in session:
            raise BadInputError(f"session {body['session_id']!r} is finished ({session['finished']['reason']})")
        try:
            model_id = f"{body['session_id']}:train:{int(body['model_seq_id'])}"
        except (KeyError, TypeError, ValueError):
            raise BadInputError("create_model needs an integer model_seq_id") from None
        lora_cfg = body.get("lora_config") or {}
        rank = int(lora_cfg.get("rank", 0))
        if rank < 0:
            raise BadInputError(f"lora_config.rank must be >= 0, got {rank}")
        lora = (
            LoraSpec(
                rank,
                bool(lora_cfg.get("train_attn", True)),
                bool(lora_cfg.get("train_mlp", True)),
                int(lora_cfg.get("seed") or 0),
            )
            if rank
            else None
        )

        def work() -> Outcome:
            if model_id not in self.models:
                self.models[model_id] = TrainedModel(
                    self.load_model(),
                    pad_id=self.pad_id,
                    lora=lora,
                    lr_scale=self.cfg.lr_scale,
                    micro_batch_size=self.cfg.micro_batch_size,
                )
            return Json({"type": "create_model", "model_id": model_id})

        return self.futures.submit(self._train, work, key=("create_model", model_id), extra={"model_id": model_id})

    def unload_model(self, body: dict) -> dict:
        model_id = str(body.get("model_id"))
        self._model(model_id)

        def work() -> Outcome:
            self.models.pop(model_id, None)
            return Json({"type": "unload_model", "model_id": model_id})

        return self.futures.submit(self._train, work, extra={"model_id": model_id})

    def forward_backward(self, call: ForwardBackwardCall) -> dict:
        model = self._model(call.model_id)
        if call.loss_fn not in TINKER_LOSSES:
            raise BadInputError(f"loss_fn {call.loss_fn!r} is not supported; supported: {list(TINKER_LOSSES)}")
        if not call.data:
            raise BadInputError("forward_backward: no data")

        def work() -> Outcome:
            prompts = [
                render_chunks(d.chunks, self.renderer, self.limits, f"datum {i}") for i, d in enumerate(call.data)
            ]
            result = model.forward_backward(call, prompts)
            return Proto(encode_forward_backward_output(result.outputs, result.metrics))

        key = ("forward_backward", call.model_id, call.seq_id) if call.seq_id else None
        return self.futures.submit(self._train, work, key=key, extra={"model_id": call.model_id})

    def optim_step(self, body: dict) -> dict:
        model_id = str(body.get("model_id"))
        model = self._model(model_id)
        params = body.get("adam_params") or body.get("optim_params") or {}
        if params.get("type", "adam") not in ("adam", "adamw"):
            raise BadInputError(f"optimizer {params.get('type')!r} is not supported (adam)")
        try:
            step = AdamStep(
                **{
                    k: float(params[k])
                    for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
                    if k in params
                }
            )
        except TypeError as exc:
            raise BadInputError(f"adam_params: {exc}") from None

        def work() -> Outcome:
            return Json({"type": "optim_step", "metrics": model.optim_step(step)})

        return self.futures.submit(
            self._train, work, key=("optim_step", model_id, body.get("seq_id")), extra={"model_id": model_id}
        )

    def save_weights_for_sampler(self, body: dict) -> dict:
        model_id = str(body.get("model_id"))
        model = self._model(model_id)
        name = body.get("path")
        seq = body.get("sampling_session_seq_id")
        if name is None and seq is None:
            raise BadInputError("save_weights_for_sampler needs a path (name) or a sampling_session_seq_id")
        if name is not None and ("/" in str(name) or not str(name)):
            raise BadInputError(f"sampler weights name {name!r} must be non-empty and without '/'")
        path = f"tinker://{model_id}/sampler_weights/{name if name is not None else f'ephemeral-{seq}'}"

        def work() -> Outcome:
            self.pool.save(path, model.sampler_weights())
            if name is not None:
                return Json({"type": "save_weights_for_sampler", "path": path})
            return Json({"type": "save_weights_for_sampler", "sampling_session_id": self._bind_sampler(path)})

        return self.futures.submit(
            self._train, work, key=("save_sampler", model_id, body.get("seq_id")), extra={"model_id": model_id}
        )

    # ------------------------------------------------------------------ sampling

    def _bind_sampler(self, key: str) -> str:
        sid = f"sampler-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self.sampling_sessions[sid] = key
        return sid

    def create_sampling_session(self, body: dict) -> dict:
        path, base = body.get("model_path"), body.get("base_model")
        if path is None:
            self._check_base(base)
            key = BASE
        elif not self.pool.has(str(path)):
            raise BadInputError(f"model_path {path!r}: no sampler weights saved there (save_weights_for_sampler)")
        else:
            key = str(path)
        return {"type": "create_sampling_session", "sampling_session_id": self._bind_sampler(key)}

    def sample(self, body: dict) -> dict:
        sid = body.get("sampling_session_id")
        if sid is not None:
            key = self.sampling_sessions.get(str(sid))
            if key is None:
                raise BadInputError(f"unknown sampling_session_id {sid!r}")
        elif body.get("model_path"):
            key = str(body["model_path"])
        else:
            self._check_base(body.get("base_model"))
            key = BASE
        spec = sample_spec(body, max_samples=self.cfg.max_samples, default_max_tokens=self.cfg.default_max_tokens)
        chunks = chunks_from_json(body.get("prompt") or {})

        def work() -> Outcome:
            prompt = render_chunks(chunks, self.renderer, self.limits, "prompt")
            return Proto(encode_sample_response(self.pool.sample(key, prompt, spec)))

        out = self.futures.submit(self._sample, work)
        out["sample_sequence_ids"] = [f"{out['request_id']}:{i}" for i in range(spec.num_samples)]
        return out
