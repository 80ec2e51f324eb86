"""The one typed training config: sections of frozen dataclasses, help written once per field.

A recipe is a TOML file (``vlrl/recipes/<name>.toml``) with one table per section; command-line
overrides are ``section.key=value`` (``rollout.max_tokens=16``, ``algo.kl_coef=0.01``), parsed
with the field's type. ``vlrl train --help-config`` prints every key with its help.
"""

from __future__ import annotations

import ast
import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlrl.algos.config import AlgoConfig, attribute_docs

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


@dataclass(frozen=True)
class ModelSection:
    arch: str = "qwen2_5_vl"
    """Architecture of the built checkpoint: qwen2_vl, qwen2_5_vl or qwen3_vl."""
    size: str = "tiny"
    """Size of the built checkpoint: tiny (CPU) or 2b."""
    seed: int = 0
    """Seed of the random-init weights."""
    path: str | None = None
    """A checkpoint directory to train instead of building one (e.g. a downloaded Qwen-VL)."""
    device: str = "cpu"
    """cpu or cuda."""
    dtype: str = "float32"
    """Weights dtype of trainer and engine: float32 or bfloat16."""
    attention: str = "vlrl_sdpa"
    """Attention of trainer and engine: vlrl_sdpa (SDPA with materialised kv heads, see
    vlrl.models.attention), sdpa (transformers' own, hit by a CUDA kernel bug; for diagnosis) or eager."""


@dataclass(frozen=True)
class DataSection:
    env: str = "color_square"
    """Env class of the train and eval rows."""
    extras: dict = field(default_factory=dict)
    """Env extras for every row."""
    train_rows: int = 512
    """Train rows (seeds drawn from run.seed); the stream cycles through them."""
    eval_rows: int = 64
    """Eval rows (fixed eval seeds, disjoint from train)."""


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
    mode: str = "multi_turn"
    """multi_turn (one sequence per episode) or step (one per turn)."""
    engine: str = "embedded"
    """Inference engine: embedded (in process) or vllm (a vLLM server started for the run)."""
    eval_temperature: float = 0.0
    """Sampling temperature of evaluation (0 = greedy)."""
    logprobs_topk: int = 0
    """Engine top-k logprobs per generated token, for the full-distribution agreement check at
    every step (top-k overlap and a KL over the whole vocabulary); 0 = off."""


@dataclass(frozen=True)
class SFTSection:
    steps: int = 0
    """Supervised steps on expert trajectories before RL (0 = none)."""
    rows_per_step: int = 32
    """Expert episodes per SFT step."""
    lr: float = 1e-3
    """SFT learning rate (its own AdamW, dropped before RL)."""
    expert: str = ""
    """Expert policy (vlrl.train.experts): maze2d, color_square, color_square/format; "" = by env."""


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


@dataclass(frozen=True)
class RunSection:
    steps: int = 20
    """RL steps."""
    eval_every: int = 10
    """Evaluate every N RL steps (and before and after training); 0 = only before and after."""
    checkpoint_every: int = 0
    """Save a checkpoint every N RL steps (0 = only at the end)."""
    out: str = "runs/{name}"
    """Run directory ({name} = the recipe name)."""
    seed: int = 0
    """Seed of train rows, sampling and mini-batch order."""
    agreement: str = "stop"
    """When rollout and trainer logprobs disagree beyond the bound: stop the run, or log it."""
    samples: int = 4
    """Eval trajectories saved per evaluation (for the report)."""
    resume: str | None = None
    """A checkpoint dir to resume from exactly ("latest": the run dir's newest)."""
    progress: bool = True
    """Progress bars on a terminal."""
    image_probe: bool = False
    """After SFT and at the end, check that every turn's logprobs depend on its image
    (vlrl.checks.image_sensitivity); results in image_sensitivity.jsonl and the report."""


SECTIONS = {"model": ModelSection, "data": DataSection, "rollout": RolloutSection, "sft": SFTSection,
            "algo": AlgoConfig, "optim": OptimSection, "run": RunSection}


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
                    lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def load_config(recipe: str | Path, overrides: list[str] = ()) -> TrainConfig:
    """A recipe name (``color_square``) or TOML path, with ``section.key=value`` overrides applied."""
    path = Path(recipe)
    if not path.suffix:
        path = RECIPES / f"{recipe}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.toml")))
        raise FileNotFoundError(f"no recipe {recipe!r} (looked for {path}); recipes: {known}")
    raw = tomllib.loads(path.read_text())
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or (section not in SECTIONS and section != "name") or (section in SECTIONS and not dot):
            raise ValueError(f"override {item!r} is not section.key=value (sections: {', '.join(SECTIONS)})")
        if section == "name":
            raw["name"] = value
        else:
            raw.setdefault(section, {})[name] = _parse(value)
    return build_config(raw, default_name=path.stem)


def build_config(raw: dict, default_name: str = "run") -> TrainConfig:
    parts = {}
    for section, cls in SECTIONS.items():
        values = dict(raw.get(section, {}))
        hints = typing.get_type_hints(cls)
        unknown = set(values) - set(hints)
        if unknown:
            raise ValueError(f"[{section}] has unknown key(s) {sorted(unknown)}; known: {sorted(hints)}")
        try:
            parts[section] = cls(**{k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()})
        except (KeyError, TypeError) as exc:  # e.g. an unknown algorithm name: one error type for callers
            raise ValueError(f"[{section}] {exc.args[0] if exc.args else exc}") from None
    unknown = set(raw) - set(SECTIONS) - {"name"}
    if unknown:
        raise ValueError(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return TrainConfig(name=str(raw.get("name", default_name)), **parts)


def _parse(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as rollout.engine=vllm


def _coerce(value: Any, hint: Any, where: str) -> Any:
    types = typing.get_args(hint) or (hint,)
    if value is None and type(None) in types:
        return None
    for t in types:
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if t is tuple and isinstance(value, str):
            return (value,)
        if isinstance(t, type) and isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
    raise ValueError(f"{where} = {value!r}: expected {hint}")


def config_help() -> str:
    """Every key with its help, section by section."""
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        docs = attribute_docs(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"  {section}.{f.name} = {default!r}\n      {docs.get(f.name, '')}")
    return "\n".join(lines)
