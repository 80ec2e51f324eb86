"""Kept so ``vlrl.algos.registry`` imports keep working: the registry lives in :mod:`vlrl.registry`."""

from vlrl.registry import DuplicateNameError, Registry, UnknownNameError

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError"]
