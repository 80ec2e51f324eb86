"""benchmarks/maze_perception.py's readout: which prompt positions each key is read at, and its heads' record type
(a frozen dataclass, which loads only as a registered module: tests/envs/bench_script.py)."""

from __future__ import annotations

import dataclasses

import pytest
from bench_script import load  # tests/envs is on sys.path (as maze_cpu)


@pytest.fixture(scope="module")
def probe():
    return load("maze_perception.py")


def test_keys_are_read_at_the_prompts_last_positions(probe):
    assert probe._readout_at(3, "move", say=False) == [-3, -2, -1]
    assert probe._readout_at(6, "neighbours", say=False) == [-6, -5, -4, -3, -2, -1]


def test_a_said_position_is_read_where_each_digit_is_predicted(probe):
    # the reply's tail: row digit, col digit (+ " right up left down" for neighbours); row is predicted before the
    # row digit, col before the col digit, the rest after the digits at the tail's last positions
    assert probe._readout_at(3, "move", say=True) == [-3, -2, -1]
    assert probe._readout_at(6, "neighbours", say=True) == [-7, -6, -4, -3, -2, -1]


def test_the_heads_record_is_frozen(probe):
    readout = probe._Readout(None, [1, 2], [-2, -1], ("row", "col"), {"row": 2, "col": 2}, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        readout.per_img = 5
