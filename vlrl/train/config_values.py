"""Values of the typed config: TOML and ``key=value`` text coerced to a dataclass field's type, and back.

Generic over frozen dataclasses (a config section, or a table inside one such as ``model.lora``): each value
becomes the field's type or a :class:`~vlrl.errors.ConfigError` naming the key, the value and what was expected.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import types
import typing
from typing import Any, Literal

from vlrl.errors import ConfigError


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def set_nested(table: dict, key: str, value: Any, item: str) -> None:
    """``key`` = ``lora.rank`` sets ``table["lora"]["rank"]`` (a table inside a section)."""
    *parents, last = key.split(".")
    for part in parents:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ConfigError(f"override {item!r}: {part} is not a table")
    table[last] = value


def build_table(cls, values: dict, where: str):
    """One section (or a table inside one, such as ``model.lora``) from its keys, each coerced to its type."""
    hints = typing.get_type_hints(cls)
    unknown = set(values) - set(hints)
    if unknown:
        raise ConfigError(f"[{where}] has unknown key(s) {sorted(unknown)}; known: {sorted(hints)}")
    try:
        return cls(**{k: coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()})
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError) as exc:  # e.g. an unknown algorithm name: one error type
        raise ConfigError(f"[{where}] {exc.args[0] if exc.args else exc}") from None


BOOLS = {"true": True, "false": False}
"""TOML's spelling of booleans, as vlrl's own messages write them (``run.image_probe=true``); Python's works too."""


def parse_value(text: str) -> Any:
    if text in BOOLS:
        return BOOLS[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string such as rollout.engine=vllm


def coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the field's type, or ValueError naming the key, the value and what was expected."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for t in options:
        if typing.get_origin(t) is Literal:
            if isinstance(value, str) and value in typing.get_args(t):
                return value
            continue
        if dataclasses.is_dataclass(t) and isinstance(value, dict):
            return build_table(t, value, where)
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if t is tuple and isinstance(value, str):
            return (value,)
        if isinstance(t, type) and isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
    raise ConfigError(f"{where} = {value!r}: expected {describe(hint)}")


def describe(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if args:
        return " or ".join(describe(a) for a in args)
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def table_type(hint: Any) -> type | None:
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return next((t for t in options if isinstance(t, type) and dataclasses.is_dataclass(t)), None)
