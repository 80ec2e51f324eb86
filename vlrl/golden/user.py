"""A user's own golden scenarios: pin the exact tokens and loss masks of *your* env's episodes.

In your project, a module (say ``my_scenarios.py``) holds a list named ``SCENARIOS``::

    from vlrl.golden import Scenario

    SCENARIOS = [
        Scenario("dot_top_left", env="quadrant_env:make_env", actions=("<answer>top-left</answer>",), seed=0),
    ]

``env`` is ``module:factory`` (``factory(seed, **extras) -> Env``, the rule of ``vlrl check-env``) or a
registered env name. Then::

    vlrl golden regen --scenarios my_scenarios          # writes golden/<arch>/<name>.golden, only these
    vlrl golden check --scenarios my_scenarios          # exit 1 with a token-level diff per changed file

and in a test, with the plugin's ``vlrl_golden`` fixture::

    @pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
    def test_golden(vlrl_golden, scenario):
        vlrl_golden.check_scenario(scenario)

The script is the policy (no model weights are used), so the files change only when the env's messages,
the chat template, the image processing or the loss-mask rules change.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from vlrl.errors import UsageError

Arch = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ScenarioError(UsageError, ValueError):
    """A scenario spec or scenarios module that cannot be used (names the scenario or module)."""


@dataclass(frozen=True)
class Scenario:
    """One scripted episode of your env, pinned in ``golden/<arch>/<name>.golden``.

    name: the file's name, unique in its module (letters, digits, ``_.-``).
    env: ``module:factory`` (``factory(seed, **extras) -> Env``) or a registered env name.
    actions: the assistant's replies, one per turn (the script plays the policy).
    arch: the tiny checkpoint whose template and processor render it.
    seed, extras: what the env is made with. stop, max_tokens: sampling's stop strings and per-turn budget
    (a reply is cut at a stop string, as the engine would). max_turns, max_context: rollout limits.
    """

    name: str
    env: str
    actions: tuple[str, ...]
    arch: Arch = "qwen2_5_vl"
    seed: int = 0
    extras: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    stop: tuple[str, ...] = ()
    max_tokens: int = 128
    max_turns: int | None = None
    max_context: int | None = None

    def __post_init__(self) -> None:
        from vlrl.models.archs import ARCHS

        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ScenarioError(f"Scenario name {self.name!r}: use letters, digits and _.- (it names the file)")
        if not isinstance(self.env, str) or not self.env.strip():
            raise ScenarioError(f"Scenario {self.name}: env must be 'module:factory' or a registered name")
        actions = (self.actions,) if isinstance(self.actions, str) else tuple(self.actions)
        if not actions or not all(isinstance(a, str) for a in actions):
            raise ScenarioError(f"Scenario {self.name}: actions must be a non-empty sequence of strings")
        if self.arch not in ARCHS:
            raise ScenarioError(f"Scenario {self.name}: arch {self.arch!r} is not one of {', '.join(ARCHS)}")
        object.__setattr__(self, "actions", actions)
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    def __str__(self) -> str:  # so ``ids=str`` names a parametrized test by the scenario
        return self.name

    @property
    def relpath(self) -> str:
        """The file under the golden folder: ``<arch>/<name>.golden``."""
        return f"{self.arch}/{self.name}.golden"


def regen_command(module: str | None, name: str, golden_dir: str = "golden") -> str:
    """The command that rewrites one scenario's file (``module`` unknown: a placeholder)."""
    where = "" if golden_dir == "golden" else f" --dir {golden_dir}"
    return f"vlrl golden regen --scenarios {module or '<your scenarios module>'} --only {name}{where}"


def load_scenarios(module_name: str) -> tuple[Scenario, ...]:
    """``module_name``'s ``SCENARIOS`` (imported with the current folder on ``sys.path``), checked."""
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")  # so `--scenarios my_scenarios` finds ./my_scenarios.py, as check-env does
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ScenarioError(f"--scenarios {module_name}: cannot import it ({exc})") from None
    items = getattr(module, "SCENARIOS", None)
    if items is None:
        raise ScenarioError(f"--scenarios {module_name}: the module has no SCENARIOS list of vlrl.golden.Scenario")
    return check_scenarios(items, module_name)


def check_scenarios(items: Any, where: str) -> tuple[Scenario, ...]:
    if isinstance(items, Mapping):
        items = list(items.values())
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise ScenarioError(f"{where}.SCENARIOS must be a list of vlrl.golden.Scenario, not {type(items).__name__}")
    seen: set[str] = set()
    for k, sc in enumerate(items):
        if not isinstance(sc, Scenario):
            raise ScenarioError(f"{where}.SCENARIOS[{k}] is a {type(sc).__name__}, not a vlrl.golden.Scenario")
        if sc.name in seen:
            raise ScenarioError(f"{where}.SCENARIOS: two scenarios are named {sc.name!r} (a name is one file)")
        seen.add(sc.name)
    return tuple(items)


def module_of(scenario: Scenario) -> str | None:
    """The imported module whose ``SCENARIOS`` holds this very object (for the fixing command), if any."""
    for name, module in list(sys.modules.items()):
        items = getattr(module, "SCENARIOS", None) if module is not None else None
        if isinstance(items, Mapping):
            items = list(items.values())
        if isinstance(items, (list, tuple)) and any(s is scenario for s in items):
            return name
    return None


def _env_class(scenario: Scenario) -> str:
    """The registry name the rollout uses: a ``module:factory`` is imported and filed under that string."""
    if ":" not in scenario.env:
        return scenario.env
    from vlrl.envs.registry import register_env

    module_name, _, attr = scenario.env.partition(":")
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")
    try:
        fn: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as exc:
        raise ScenarioError(f"Scenario {scenario.name}: env {scenario.env}: {exc}") from None
    if not callable(fn):
        raise ScenarioError(f"Scenario {scenario.name}: env {scenario.env} is not callable")
    # the factory convention of `data.env=module:factory`: factory(seed, **extras) -> Env
    register_env(scenario.env, lambda extras, seed: fn(seed, **dict(extras)), replace=True)
    return scenario.env


def header_line(scenario: Scenario) -> str:
    return (
        f"# Your scenario {scenario.name} (env {scenario.env}); regenerate with "
        f"`vlrl golden regen --scenarios <module> --only {scenario.name}`; read the diff before committing."
    )


def render_user_scenario(scenario: Scenario, renderer: Any, max_context: int) -> str:
    """The golden text of ``scenario`` played through ``renderer`` in a context of ``max_context`` tokens."""
    from vlrl.engines.types import SamplingParams
    from vlrl.golden.files import format_golden, play
    from vlrl.golden.scenarios import ScriptedEpisode

    episode = ScriptedEpisode(
        scenario.name,
        scenario.description or f"{scenario.env}, seed {scenario.seed}",
        {"prompt": None, "env_class": _env_class(scenario), "extras": dict(scenario.extras), "seed": scenario.seed},
        scenario.actions,
        sampling=SamplingParams(max_tokens=scenario.max_tokens, stop=scenario.stop),
        max_turns=scenario.max_turns,
        max_context=scenario.max_context,
    )
    tok = renderer.tokenizer
    traj = play(episode, renderer, max_context, tokenizer=tok)
    return format_golden(traj, tok, scenario.arch, episode, header_line(scenario))


def renderer_for(arch: str, model_cache: str | Path | None = None) -> tuple[Any, int]:
    """``(renderer, max_context)`` of the tiny checkpoint of ``arch`` (built once into the cache)."""
    import json

    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer

    path = cached_model_dir(arch, "tiny", cache_root=model_cache)
    config = json.loads((Path(path) / "config.json").read_text())
    return EmbeddedRenderer.from_pretrained(path), int(config.get("text_config", config)["max_position_embeddings"])
