"""Training runs as tests: recipe fixtures and report extras (marker `train`)."""

from __future__ import annotations
