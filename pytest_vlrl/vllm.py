"""vLLM server fixtures and options (marker `vllm`)."""

from __future__ import annotations
