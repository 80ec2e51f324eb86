"""The geometry SFT expert: the env's own answer, boxed, as the final answer of the first turn.

It teaches the answer format (and the answers of the seen problems); the env grades it and ends the
episode. Reads the env's state after ``init``, like every expert, so its episodes go through the same
rollout path as the policy's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def geometry_expert(env, row: Mapping[str, Any]) -> Iterator[str]:
    yield f"\\boxed{{{env.ground_truth}}}"
