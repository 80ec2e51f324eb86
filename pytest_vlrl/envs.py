"""Env conformance fixtures and helpers (filled in by the envs work)."""
