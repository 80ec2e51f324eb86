"""Errors vlrl raises on purpose. Each names what was wrong and where."""

from __future__ import annotations


class VlrlError(Exception):
    """Base class of every error vlrl raises on purpose."""


class UsageError(VlrlError):
    """The command line or the config asks for something impossible (the CLI exits with status 2)."""


class ConfigError(UsageError, ValueError):
    """A training config that does not parse or validate: names the key, the value and what is expected."""


class MissingRecipeError(UsageError, FileNotFoundError):
    """A recipe name or TOML path that does not exist."""


class BadInputError(VlrlError, ValueError):
    """A conversation, image or request that vlrl refuses, with its location.

    ``message_index`` / ``part_index`` point into the OpenAI-format message list
    (``None`` when the problem is not tied to one message or part).
    """

    def __init__(self, what: str, *, message_index: int | None = None, part_index: int | None = None):
        self.what = what
        self.message_index = message_index
        self.part_index = part_index
        where = []
        if message_index is not None:
            where.append(f"message {message_index}")
        if part_index is not None:
            where.append(f"part {part_index}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(prefix + what)


class ContextOverflowError(BadInputError):
    """A prompt that does not fit the model's context (``detail`` replaces the default sentence)."""

    def __init__(self, n_tokens: int, limit: int, detail: str | None = None):
        self.n_tokens = n_tokens
        self.limit = limit
        super().__init__(detail or f"prompt has {n_tokens} tokens, more than the context limit of {limit}")
