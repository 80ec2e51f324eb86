"""geometry: the grading table, hostile answers, the calc_score interaction, image-prompt rows."""

from __future__ import annotations

import json

import pytest

from vlrl.checks.hostile import ExecutionSentinel
from vlrl.envs import make_env
from vlrl.envs.geometry.env import LAST_CHANCE, find_tool_call
from vlrl.envs.geometry.grading import extract_answer, grade, last_boxed
from vlrl.messages import load_image

EQUIVALENT = [
    ("40", "40"),
    ("40^\\circ", "40"),
    ("40^{\\circ}", "40"),
    ("40°", "40"),
    ("$40$", "40"),
    ("x = 40", "40"),
    ("40.0", "40"),
    (" 40 ", "40"),
    ("40 \\text{ degrees}", "40"),
    ("12 cm", "12"),
    ("2\\sqrt{13}", "2\\sqrt{13}"),
    ("\\sqrt{52}", "2\\sqrt{13}"),
    ("2 \\sqrt{13}", "\\sqrt{52}"),
    ("sqrt(52)", "2\\sqrt{13}"),
    ("2*\\sqrt{13}", "2\\sqrt{13}"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "0.75"),
    ("1/2", "\\frac{1}{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("\\sqrt[3]{8}", "2"),
    ("2^{10}", "1024"),
    ("2\\pi", "\\pi \\cdot 2"),
    ("\\left(3\\right)", "3"),
    ("-5", "-(5)"),
    ("4\\sqrt{2}", "\\sqrt{32}"),
    ("6 \\times 7", "42"),
    ("\\frac{10}{\\sqrt{2}}", "5\\sqrt{2}"),
]
NOT_EQUIVALENT = [
    ("41", "40"),
    ("3.464", "2\\sqrt{3}"),
    ("\\sqrt{13}", "2\\sqrt{13}"),
    ("40.1", "40"),
    ("-40", "40"),
    ("\\frac{1}{3}", "0.33"),
    ("2\\pi", "6.28"),
    ("x", "40"),
    ("", "40"),
    ("40 + y", "40"),
]
HOSTILE = [
    "__import__('os').system('true')",
    "exec('print(1)')",
    "eval('40')",
    "lambda: 40",
    "().__class__",
    "open('/etc/passwd').read()",
    "9^9^9^9",
    "2^{10000000}",
    "10^{10^{10}}",
    "(" * 500 + "40" + ")" * 500,
    "\\frac{1}{0}",
    "1/0",
    "0^{-1}",
    "4" * 10_000,
    "40" + " " * 300,
    "\\input{/etc/passwd}",
    "\\def\\x{40}\\x",
    "Symbol('x')",
    "40; import os",
    "40\x00",
    "\\sqrt[100]{40}",
    "'40'",
    "{40",
    "40}",
    "\\boxed{40}",
]


@pytest.mark.parametrize("given,truth", EQUIVALENT)
def test_equivalent_forms_accepted(given, truth):
    assert grade(given, truth)


@pytest.mark.parametrize("given,truth", NOT_EQUIVALENT)
def test_wrong_answers_rejected(given, truth):
    assert not grade(given, truth)


@pytest.mark.parametrize("given", HOSTILE)
def test_hostile_answers_rejected_without_execution(given):
    sentinel = ExecutionSentinel()
    with sentinel.watch() as events:
        assert not grade(given, "40")
    assert events == []


def test_a_broken_grader_would_be_caught_by_the_sentinel():
    sentinel = ExecutionSentinel()
    with sentinel.watch() as events:
        assert eval("4" + "0") == 40  # what an unsafe grader does with model text
    assert events and "exec of code compiled from a string" in events[0]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{", None),
        ("\\boxed {3}", "3"),
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_extract_answer_falls_back_to_last_line():
    assert extract_answer("reasoning\nAnswer: 12\n\n") == "Answer: 12"
    assert grade(extract_answer("reasoning\nAnswer: 12\n"), "12")


def _call(answer) -> str:
    return "<tool_call>" + json.dumps({"name": "calc_score", "arguments": {"answer": answer}}) + "</tool_call>"


def test_tool_call_parsing_variants():
    assert find_tool_call(_call("5")) == (True, "5")
    nested = '<tool_call>{"function": {"name": "calc_score", "arguments": "{\\"answer\\": \\"7\\"}"}}</tool_call>'
    assert find_tool_call(nested) == (True, "7")
    assert find_tool_call(_call("1") + " later " + _call("2")) == (True, "2")
    assert find_tool_call('<tool_call>{"name": "rm", "arguments": {"answer": "1"}}</tool_call>') == (True, None)
    assert find_tool_call("<tool_call>{not json}</tool_call>") == (True, None)
    assert find_tool_call("no call") == (False, None)


def _env(seed=0, **extras):
    env = make_env("geometry", extras, seed)
    messages, info = env.init(None)
    return env, messages, info


def test_prompt_has_image_first_and_instructions():
    _, messages, info = _env(4)
    content = messages[0]["content"]
    assert [p["type"] for p in content] == ["image_url", "text"]
    assert load_image(content[0]).size == (320, 240)
    assert "calc_score" in content[1]["text"] and "\\boxed{$Answer}" in content[1]["text"]
    assert "<image>" not in content[1]["text"] and "Find x" in content[1]["text"]
    assert info["ground_truth"]


def test_correct_tool_call_ends_with_reward_one():
    env, _, info = _env(1)
    result = env.step(_call(info["ground_truth"]))
    assert (result.reward, result.done, result.observations) == (1.0, True, [])
    assert result.metadata["acc"] == 1.0 and result.metadata["turns"] == 1


def test_wrong_calls_give_text_feedback_then_last_chance_then_end():
    env, _, info = _env(2)
    first = env.step(_call("-1"))
    assert not first.done and first.reward == 0.0
    assert [p["type"] for p in first.observations[0]["content"]] == ["text"]  # text only after turn 1
    text = first.observations[0]["content"][0]["text"]
    assert text.startswith("calc_score result: 0.0. Parsed answer '-1' does not match the reference.")
    assert LAST_CHANCE not in text
    second = env.step(_call("-2"))
    assert second.observations[0]["content"][0]["text"].endswith(
        "Provide your final answer in the form: Answer: \\boxed{$Answer}"
    )  # single braces: quirk not copied
    third = env.step(_call("-3"))
    assert third.done and third.reward == 0.0 and third.metadata["turns"] == 3


def test_final_boxed_answer_is_graded_at_once():
    env, _, info = _env(3)
    result = env.step(f"<think>...</think> Answer: \\boxed{{{info['ground_truth']}}}")
    assert result.done and result.reward == 1.0
    env, _, info = _env(3)
    assert env.step("Answer: \\boxed{-7}").reward == 0.0


def test_bad_tool_call_feedback_and_done_only_on_last_turn():
    env, _, _ = _env(5)
    for _ in range(2):
        result = env.step('<tool_call>{"name": "calc_score", "arguments": {}}</tool_call>')
        assert not result.done and "Invalid tool call" in result.observations[0]["content"][0]["text"]
    result = env.step("<tool_call>{}</tool_call>")
    assert result.done and result.reward == 0.0


def test_image_prompt_row_uses_its_own_prompt_and_ground_truth():
    env, messages, info = _env(6)
    row_env = make_env("geometry", {"reward_spec": {"ground_truth": info["ground_truth"]}}, None)
    got, _ = row_env.init(messages)
    assert got == messages
    assert row_env.step(_call(info["ground_truth"])).reward == 1.0


def test_problem_kinds_all_appear_and_are_deterministic():
    kinds = {make_env("geometry", {}, s).init(None)[1]["kind"] for s in range(40)}
    assert kinds == {"angle_sum", "isosceles", "hypotenuse", "leg"}
    a, b = make_env("geometry", {}, 9).init(None), make_env("geometry", {}, 9).init(None)
    assert a == b
