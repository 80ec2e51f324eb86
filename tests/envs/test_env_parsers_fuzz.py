"""Every parser of model text, fuzzed directly: arbitrary text never raises and never executes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.checks.hostile import FRAGMENTS, ExecutionSentinel
from vlrl.envs.color_square import DEFAULT_PALETTE, colour_parser
from vlrl.envs.geometry.env import find_tool_call
from vlrl.envs.geometry.grading import extract_answer, grade
from vlrl.envs.gym_adapter import SHIPPED, keyword_parser
from vlrl.envs.maze_text import parse_keyword_action, parse_tuple_action

TEXT = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=20).map("".join))
PARSERS = [
    parse_tuple_action,
    parse_keyword_action,
    colour_parser(list(DEFAULT_PALETTE)),
    keyword_parser(SHIPPED["Taxi-v4"].keywords),
]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT)
def test_parsers_total_and_inert(text):
    sentinel = ExecutionSentinel()
    with sentinel.watch() as events:
        for parse in PARSERS:
            parsed = parse(text)
            assert (parsed.action is None) == bool(parsed.feedback)
        found, answer = find_tool_call(text)
        assert answer is None or found
        assert grade(extract_answer(text), "40") in (True, False)
    assert events == []
