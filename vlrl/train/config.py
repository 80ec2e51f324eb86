"""The one typed training config: sections of frozen dataclasses, help written once per field.

A recipe is a TOML file (``vlrl/recipes/<name>.toml``) with one table per section; command-line
overrides are ``section.key=value`` (``rollout.max_tokens=16``, ``algo.kl_coef=0.01``), parsed
with the field's type. ``vlrl train --help-config`` prints every key with its help.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vlrl.algos.config import AlgoConfig
from vlrl.errors import ConfigError, MissingRecipeError
from vlrl.train.config_values import build_table, parse_value, set_nested, toml_value
from vlrl.vllm.config import Execution

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

Arch = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]  # = vlrl.models.archs.ARCHS (a test keeps them equal)
Size = Literal["tiny", "tiny_kv2", "2b"]  # = vlrl.models.archs.SIZES
Dtype = Literal["float32", "bfloat16"]
Attention = Literal["vlrl_sdpa", "sdpa", "eager"]  # = vlrl.models.attention.CHOICES
Kernels = Literal["fused", "eager"]  # = vlrl.models.fused.Kernels
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def _check(ok: bool, where: str, value: Any, need: str) -> None:
    if not ok:
        raise ConfigError(f"{where} = {value!r}: {need}")


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder's linear layers (Qwen-VL names): attention and MLP of every language-model layer."""


@dataclass(frozen=True)
class LoraSection:
    """``model.lora``: train low-rank adapters (peft) instead of the model's weights (see vlrl.models.lora)."""

    rank: int = 8
    """Adapter rank r."""
    alpha: float = 16.0
    """LoRA alpha: the update is scaled by alpha / rank."""
    targets: tuple = LORA_TARGETS
    """Language-model linear layers to adapt, by the last part of their name (q_proj, ..., down_proj)."""
    vision: Literal["frozen", "adapted"] = "frozen"
    """Vision tower and projector: frozen (no adapters), or adapted (an adapter on each of their linear layers)."""

    def __post_init__(self) -> None:
        _check(self.rank >= 1, "model.lora.rank", self.rank, "must be >= 1")
        _check(math.isfinite(self.alpha) and self.alpha > 0, "model.lora.alpha", self.alpha, "must be > 0")
        _check(
            len(self.targets) >= 1 and all(isinstance(t, str) and t for t in self.targets),
            "model.lora.targets",
            self.targets,
            "must name at least one linear layer (e.g. q_proj)",
        )


@dataclass(frozen=True)
class ModelSection:
    arch: Arch = "qwen2_5_vl"
    """Architecture of the built checkpoint: qwen2_vl, qwen2_5_vl or qwen3_vl."""
    size: Size = "tiny"
    """Size of the built checkpoint: tiny (CPU), tiny_kv2 (tiny with two kv heads) or 2b."""
    seed: int = 0
    """Seed of the random-init weights."""
    path: str | None = None
    """A checkpoint directory to train instead of building one (e.g. a downloaded Qwen-VL)."""
    device: str = "cpu"
    """cpu or cuda (cuda:N)."""
    dtype: Dtype = "float32"
    """Weights dtype of trainer and engine: float32 or bfloat16."""
    attention: Attention = "vlrl_sdpa"
    """Attention of trainer and engine: vlrl_sdpa (SDPA with materialised kv heads, see
    vlrl.models.attention), sdpa (transformers' own, hit by a CUDA kernel bug; for diagnosis) or eager."""
    kernels: Kernels = "eager"
    """RMSNorm, SwiGLU and rotary of trainer and engine: eager (transformers' own) or fused (compiled kernels for
    bf16 on CUDA, vlrl.models.fused: fewer kernels and less memory in the update, slower decoding; CPU and fp32
    unchanged)."""
    lora: LoraSection | None = None
    """LoRA adapters, e.g. { rank = 8, alpha = 16, targets = ["q_proj", "v_proj"], vision = "frozen" }
    (override: model.lora.rank=8); only the adapters train and are checkpointed. None = full fine-tuning."""

    def __post_init__(self) -> None:
        _check(bool(_DEVICE.fullmatch(self.device)), "model.device", self.device, "expected cpu, cuda or cuda:N")
        _check(self.seed >= 0, "model.seed", self.seed, "must be >= 0")


@dataclass(frozen=True)
class DataSection:
    env: str = "color_square"
    """Env class of the train and eval rows: a registered name, or module:factory (factory(seed, **extras) -> Env,
    imported by the config; the rows then carry that string)."""
    extras: dict = field(default_factory=dict)
    """Env extras for every row (a module:factory env takes them as keyword arguments, checked at config time)."""
    train_rows: int = 512
    """Train rows (seeds drawn from run.seed); the stream cycles through them."""
    eval_rows: int = 64
    """Eval rows (fixed eval seeds, disjoint from train)."""

    def __post_init__(self) -> None:
        _check(bool(self.env), "data.env", self.env, "must name an env class")
        _check(self.train_rows >= 1, "data.train_rows", self.train_rows, "must be >= 1")
        _check(self.eval_rows >= 0, "data.eval_rows", self.eval_rows, "must be >= 0")


NEEDS_INPROCESS = "'sampler' needs rollout.engine=vllm and rollout.vllm_mode=inprocess"


@dataclass(frozen=True)
class RolloutSection:
    rows_per_step: int = 16
    """Dataset rows per RL step."""
    repeats: int = 4
    """Episodes per row: the GRPO group size."""
    max_tokens: int = 32
    """Tokens per reply."""
    temperature: float = 1.0
    """Sampling temperature (the trainer computes logprobs at the same one)."""
    top_p: float = 1.0
    """Nucleus sampling (1 = off; the logprob contract is taken before truncation)."""
    stop: tuple = ()
    """Stop strings; an end of turn is appended after them."""
    max_turns: int | None = None
    """Turn budget per episode (None: the env's)."""
    mode: Literal["multi_turn", "step"] = "multi_turn"
    """multi_turn (one sequence per episode) or step (one per turn)."""
    engine: Literal["embedded", "vllm"] = "embedded"
    """Inference engine: embedded (in process) or vllm (a vLLM server started for the run)."""
    renderer: Literal["embedded", "vllm"] = "embedded"
    """Where conversations become ids and vision tensors with engine=vllm: embedded (the checkpoint's processor
    in this process; vLLM generates from those tensors, checked against the server's renderer at start) or vllm
    (the server's render route; each image's tensors cross the wire twice). The embedded engine always renders
    embedded."""
    vllm_mode: Literal["server", "inprocess"] = "server"
    """With engine=vllm: server (its own process, over HTTP) or inprocess (``vlrl.vllm.inprocess``, same checks)."""
    vllm_execution: Execution = "auto"
    """With engine=vllm, how the server runs the model (``vlrl.vllm.server.EXECUTION_FLAGS``): auto = eager on CPU,
    decode steps as CUDA graphs on CUDA; compiled = vLLM's defaults (torch.compile: minutes at a cold start)."""
    vllm_logprobs: Literal["auto", "vllm", "sampler"] = "auto"
    """Where each sampled token's logprob comes from with engine=vllm: vllm (reported per request on every step) or
    sampler (vllm_mode=inprocess only: kept in vLLM's worker, taken when a request finishes; the same values without
    vLLM's per-request transport, which cost its engine 4.4 ms of a 14.2 ms step at 256 requests on an H200;
    ``vlrl.vllm.sampled_logprobs``); auto = sampler in process, vllm from a server."""
    vllm_ban: Literal["auto", "processor", "bad_words"] = "auto"
    """How vLLM is kept from sampling vision tokens: vlrl's logits processor, or vLLM's bad_words (a server is then
    started without the processor, and vLLM may run its model runner V2); auto = bad_words where it then does in
    process, the processor on servers (V2 servers have not run on a GPU yet)."""
    eval_temperature: float = 0.0
    """Sampling temperature of evaluation (0 = greedy)."""
    logprobs_topk: int = 0
    """Engine top-k logprobs per generated token, for the full-distribution agreement check at
    every step (top-k overlap and a KL over the whole vocabulary); 0 = off."""

    def __post_init__(self) -> None:
        for key in ("rows_per_step", "repeats", "max_tokens"):
            _check(getattr(self, key) >= 1, f"rollout.{key}", getattr(self, key), "must be >= 1")
        _check(
            math.isfinite(self.temperature) and self.temperature > 0,
            "rollout.temperature",
            self.temperature,
            "must be > 0 (training samples; the logprob contract divides by it)",
        )
        _check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "must be in (0, 1]")
        _check(all(isinstance(x, str) and x for x in self.stop), "rollout.stop", self.stop, "must be non-empty strings")
        _check(self.max_turns is None or self.max_turns >= 1, "rollout.max_turns", self.max_turns, "must be >= 1")
        _check(
            math.isfinite(self.eval_temperature) and self.eval_temperature >= 0,
            "rollout.eval_temperature",
            self.eval_temperature,
            "must be >= 0 (0 = greedy)",
        )
        _check(self.logprobs_topk >= 0, "rollout.logprobs_topk", self.logprobs_topk, "must be >= 0")
        inprocess = self.engine == "vllm" and self.vllm_mode == "inprocess"
        _check(self.vllm_logprobs != "sampler" or inprocess, "rollout.vllm_logprobs", "sampler", NEEDS_INPROCESS)
        bad_words_ok = self.vllm_ban != "bad_words" or self.engine == "vllm"
        _check(bad_words_ok, "rollout.vllm_ban", "bad_words", "needs rollout.engine=vllm")


@dataclass(frozen=True)
class SFTSection:
    steps: int = 0
    """Supervised steps on expert trajectories before RL (0 = none)."""
    rows_per_step: int = 32
    """Expert episodes per SFT step."""
    lr: float = 1e-3
    """SFT learning rate (its own AdamW, dropped before RL)."""
    expert: str = ""
    """Expert policy (vlrl.train.experts): maze2d, color_square, color_square/format, geometry, or module:fn
    (fn(env, row) -> replies); "" = by env."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "sft.steps", self.steps, "must be >= 0")
        _check(self.rows_per_step >= 1, "sft.rows_per_step", self.rows_per_step, "must be >= 1")
        _check(math.isfinite(self.lr) and self.lr > 0, "sft.lr", self.lr, "must be > 0")


@dataclass(frozen=True)
class OptimSection:
    lr: float = 1e-4
    """AdamW learning rate for RL."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = off)."""
    micro_batch_size: int = 16
    """Trajectories per forward/backward (gradients accumulate exactly over a mini-batch)."""
    mini_batches: int = 1
    """Optimizer steps per epoch over the step's batch."""
    epochs: int = 1
    """Passes over the step's batch."""
    lr_scale: dict = field(default_factory=dict)
    """RL learning rate per module group, as a factor of optim.lr: { vision, merger, language, embed }
    (e.g. { embed = 0.1 }); groups left out train at optim.lr (vlrl.train.trainer.make_optimizer)."""
    master_weights: Literal["float32", "model"] = "float32"
    """bf16 runs: float32 = AdamW steps fp32 master copies (bf16 weights drop updates below half an ulp,
    vlrl.train.master); model = update the bf16 weights themselves. No effect on float32 runs."""
    packing: bool = False
    """Run each micro-batch's rows packed into one unpadded sequence (vlrl.train.packing); off = padded rows."""
    warmup_steps: int = 0
    """The RL lr ramps linearly over the first N optimizer steps (step k at k/N of it); 0 = off. A fresh AdamW
    moves every weight by about lr on its first steps whatever the gradient (vlrl.train.trainer.warmup_factor)."""

    def __post_init__(self) -> None:
        _check(math.isfinite(self.lr) and self.lr > 0, "optim.lr", self.lr, "must be > 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0 (0 = off)")
        _check(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        _check(
            len(self.betas) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas),
            "optim.betas",
            self.betas,
            "must be two numbers in [0, 1)",
        )
        _check(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, "must be >= 0 (0 = off)")
        for key in ("micro_batch_size", "mini_batches", "epochs"):
            _check(getattr(self, key) >= 1, f"optim.{key}", getattr(self, key), "must be >= 1")
        groups = ("vision", "merger", "language", "embed")  # = vlrl.train.trainer.PARAM_GROUPS' groups
        _check(
            set(self.lr_scale) <= set(groups),
            "optim.lr_scale",
            self.lr_scale,
            f"keys must be module groups: {', '.join(groups)}",
        )
        _check(
            all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in self.lr_scale.values()
            ),
            "optim.lr_scale",
            self.lr_scale,
            "factors must be numbers >= 0",
        )


@dataclass(frozen=True)
class RunSection:
    steps: int = 20
    """RL steps."""
    eval_every: int = 10
    """Evaluate every N RL steps (and before and after training); 0 = only before and after."""
    checkpoint_every: int = 0
    """Save a checkpoint every N SFT steps and every N RL steps, and at the end of SFT (0 = only at the end)."""
    out: str = "runs/{name}"
    """Run directory ({name} = the recipe name)."""
    seed: int = 0
    """Seed of train rows, sampling and mini-batch order."""
    agreement: Literal["stop", "log"] = "stop"
    """When rollout and trainer logprobs disagree beyond the bound: stop the run, or log it."""
    stop_at: float | None = None
    """End RL at the first evaluation (``eval_every``) whose mean reward reaches this; None = every step."""
    samples: int = 4
    """Eval trajectories saved per evaluation (for the report)."""
    resume: str | None = None
    """A checkpoint dir to resume from exactly, logs trimmed to it ("latest": the run dir's newest complete
    checkpoint, or a fresh start when it has none). Without it a run starts fresh, replacing what an
    earlier run left in its directory (logs, TensorBoard, samples, checkpoints)."""
    progress: bool = True
    """Progress bars on a terminal."""
    image_probe: bool = False
    """After SFT and at the end, check that every turn's logprobs depend on its image
    (vlrl.checks.image_sensitivity); results in image_sensitivity.jsonl and the report."""

    def __post_init__(self) -> None:
        for key in ("steps", "eval_every", "checkpoint_every", "samples", "seed"):
            _check(getattr(self, key) >= 0, f"run.{key}", getattr(self, key), "must be >= 0")
        _check(bool(self.out), "run.out", self.out, "must name a directory")
        _check(self.stop_at is None or math.isfinite(self.stop_at), "run.stop_at", self.stop_at, "must be a number")
        _check(
            self.resume is None or bool(self.resume), "run.resume", self.resume, 'must be a checkpoint dir or "latest"'
        )


SECTIONS = {
    "model": ModelSection,
    "data": DataSection,
    "rollout": RolloutSection,
    "sft": SFTSection,
    "algo": AlgoConfig,
    "optim": OptimSection,
    "run": RunSection,
}


@dataclass(frozen=True)
class TrainConfig:
    name: str = "run"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    sft: SFTSection = field(default_factory=SFTSection)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimSection = field(default_factory=OptimSection)
    run: RunSection = field(default_factory=RunSection)

    @property
    def out_dir(self) -> Path:
        return Path(self.run.out.format(name=self.name))

    def to_toml(self) -> str:
        lines = [f'name = "{self.name}"']
        for section in SECTIONS:
            lines.append(f"\n[{section}]")
            for key, value in dataclasses.asdict(getattr(self, section)).items():
                if value is not None:
                    lines.append(f"{key} = {toml_value(value)}")
        return "\n".join(lines) + "\n"


def load_config(recipe: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """A recipe name (``color_square``) or TOML path, with ``section.key=value`` overrides applied."""
    path = Path(recipe)
    if not path.suffix:
        path = RECIPES / f"{recipe}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.toml")))
        raise MissingRecipeError(f"no recipe {recipe!r} (looked for {path}); recipes: {known}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or (section not in SECTIONS and section != "name") or (section in SECTIONS and not dot):
            raise ConfigError(f"override {item!r} is not section.key=value (sections: {', '.join(SECTIONS)})")
        if section == "name":
            raw["name"] = value
        else:
            set_nested(raw.setdefault(section, {}), name, parse_value(value), item)
    return build_config(raw, default_name=path.stem)


def build_config(raw: dict, default_name: str = "run") -> TrainConfig:
    parts = {}
    for section, cls in SECTIONS.items():
        if not isinstance(raw.get(section, {}), dict):
            raise ConfigError(f"[{section}] must be a table of keys, got {raw[section]!r}")
        parts[section] = build_table(cls, dict(raw.get(section, {})), section)

    unknown = set(raw) - set(SECTIONS) - {"name"}
    if unknown:
        raise ConfigError(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    config = TrainConfig(name=str(raw.get("name", default_name)), **parts)
    _check_names(config)
    return config


def _check_names(config: TrainConfig) -> None:
    """Names that live in registries (the env class, the SFT expert when SFT runs) and paths that must
    exist (a checkpoint to train, one to resume from): checked before any model loads."""
    from vlrl.envs.contract import EnvError
    from vlrl.envs.registry import check_env_extras, is_target, registered_envs, resolve_env, resolve_expert

    if config.model.path is not None and not Path(config.model.path).is_dir():
        raise ConfigError(f"model.path = {config.model.path!r}: no such checkpoint directory")
    resume = config.run.resume
    if resume not in (None, "latest") and not (Path(resume) / "state.json").is_file():
        raise ConfigError(
            f"run.resume = {resume!r}: not a checkpoint directory (no state.json); "
            'give one under <run>/checkpoints/ or "latest"'
        )

    env = config.data.env
    try:
        resolve_env(env, "data.env")  # module:factory is imported here, by the config, never by a row
        if env not in registered_envs() and not env.startswith("gym/"):
            raise ConfigError(
                f"data.env = {env!r}: unknown env; registered: {', '.join(registered_envs())} "
                "(or give module:factory, factory(seed, **extras) -> Env)"
            )
        check_env_extras(env, config.data.extras)
    except EnvError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith("data.env") else f"data.env = {env!r}: {text}") from None
    lora = config.model.lora
    if lora is not None:
        unknown = sorted(set(lora.targets) - set(LORA_TARGETS))
        if unknown:  # every Qwen-VL arch names its language-model linear layers the same: no need to load one
            raise ConfigError(
                f"model.lora.targets = {lora.targets}: {unknown} not a language-model linear layer of "
                f"{config.model.arch}; valid: {', '.join(LORA_TARGETS)}"
            )
    if config.sft.steps > 0:
        from vlrl.train.experts import expert_for

        name = config.sft.expert or env.split("/")[0]
        if not config.sft.expert and is_target(env):  # a factory is no expert: name it
            raise ConfigError(
                f"sft.expert is not set and data.env = {env!r} is a module:factory; "
                "give the expert as sft.expert=module:fn (fn(env, row) -> replies) or set sft.steps=0"
            )
        try:
            if config.sft.expert:
                resolve_expert(name, "sft.expert")
            expert_for(name)
        except EnvError as exc:
            raise ConfigError(str(exc)) from None
        except KeyError as exc:
            raise ConfigError(f"sft.expert = {name!r}: {exc.args[0] if exc.args else exc}") from None
