"""Golden token / loss-mask files: --vlrl-update-golden, --vlrl-regen-all, the vlrl_golden fixture."""

from __future__ import annotations
