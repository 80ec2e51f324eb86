"""Safe grading of ``\\boxed{}`` answers: our own tokenizer and grammar build sympy objects directly.

Model text never reaches ``eval``, ``sympify`` or ``parse_expr``. The grammar accepts numbers
(integers, decimals), ``+ - * / ^``, parentheses and braces, ``\\frac{a}{b}``, ``\\sqrt{a}``,
``\\sqrt[n]{a}``, ``sqrt(a)``, ``\\pi``/``pi``, ``\\cdot``/``\\times``/``\\div`` and implicit
multiplication (``2\\sqrt{3}``, ``3\\pi``); anything else (names, calls, attributes, quotes) is
refused. Lengths, token counts, nesting depth and power sizes are bounded before sympy sees
anything, so ``9^9^9^9`` is refused rather than computed.

Two answers are equivalent when ``simplify(a - b) == 0`` (or, failing a symbolic verdict, they
agree to 40 digits). No loose tolerance: ``3.464`` is not ``2\\sqrt{3}``.
"""

from __future__ import annotations

import math
import re

import sympy

MAX_ANSWER_CHARS = 256
MAX_TOKENS = 128
MAX_DEPTH = 24
MAX_NUMBER_CHARS = 30
MAX_POWER_DIGITS = 300  # refuse powers whose result would exceed ~10**300

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?|\.\d+)|(?P<cmd>\\[A-Za-z]+)|(?P<word>[A-Za-z]+)"
    r"|(?P<op>[-+*/^(){}\[\]]))"
)
_DROP = re.compile(
    r"\\left|\\right|\\displaystyle|\\[,;!: ]|\$|\\%|%|\^\s*\{?\s*\\circ\s*\}?|°|\\circ|\\degree"
    r"|\\(?:text|mathrm|mbox)\{[^{}]*\}"
)
_UNITS = re.compile(r"\s*(?:units?|degrees?|deg|cm|mm|m|in|ft)\s*$", re.IGNORECASE)
_LEAD = re.compile(r"^\s*(?:answer\s*:)?\s*(?:x\s*=)?\s*", re.IGNORECASE)
_MUL = {"*", "\\cdot", "\\times"}
_DIV = {"/", "\\div"}


class UnsafeAnswerError(ValueError):
    """The answer text is outside the accepted grammar or its bounds."""


def normalize(answer: str) -> str:
    """Strip dollars, spacing commands, degree marks, ``\\text{}`` units and a leading ``x =``."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise UnsafeAnswerError(f"answer longer than {MAX_ANSWER_CHARS} characters")
    text = _DROP.sub("", answer)
    text = _LEAD.sub("", text)
    text = _UNITS.sub("", text)
    return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").strip()


def tokenize(text: str) -> list[tuple[str, str]]:
    """``[(kind, value)]`` with kind in num/cmd/word/op; anything unrecognised raises."""
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise UnsafeAnswerError(f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind is None:  # not reached: every alternative of _TOKEN is a named group
            raise UnsafeAnswerError(f"unexpected character {text[pos]!r}")
        tokens.append((kind, m.group(kind)))
        pos = m.end()
        if len(tokens) > MAX_TOKENS:
            raise UnsafeAnswerError("too many tokens")
    return tokens


class _Parser:
    """Recursive descent over the token list; every method returns a sympy expression."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next_is(self, *values: str) -> bool:
        """Whether the next token's value is one of ``values`` (False at the end)."""
        tok = self.peek()
        return tok is not None and tok[1] in values

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise UnsafeAnswerError(f"expected {value or 'more input'}, got {tok[1] if tok else 'end'}")
        self.i += 1
        return tok

    def expr(self) -> sympy.Expr:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UnsafeAnswerError("nested too deeply")
        value = self.term()
        while self.next_is("+", "-"):
            op = self.take()[1]
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        self.depth -= 1
        return value

    def term(self) -> sympy.Expr:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok and tok[1] in _MUL | _DIV:
                self.take()
                rhs = self.unary()
                if tok[1] in _DIV and rhs == 0:
                    raise UnsafeAnswerError("division by zero")
                value = value * rhs if tok[1] in _MUL else value / rhs
            elif tok and self._starts_primary(tok):
                value = value * self.unary()  # implicit multiplication: 2\sqrt{3}, 3\pi
            else:
                return value

    def unary(self) -> sympy.Expr:
        tok = self.peek()
        if tok and tok[1] in ("+", "-"):
            self.take()
            value = self.unary()
            return -value if tok[1] == "-" else value
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.primary()
        if self.next_is("^"):
            self.take()
            return _safe_pow(base, self.unary())
        return base

    def primary(self) -> sympy.Expr:
        kind, value = self.take()
        if kind == "num":
            if len(value) > MAX_NUMBER_CHARS:
                raise UnsafeAnswerError("number too long")
            return sympy.Rational(value)
        if value in ("(", "{"):
            inner = self.expr()
            self.take(")" if value == "(" else "}")
            return inner
        if value in ("\\pi", "pi"):
            return sympy.pi
        if value == "\\frac":
            return self._fraction()
        if value in ("\\sqrt", "sqrt"):
            return self._root(value)
        raise UnsafeAnswerError(f"unsupported token {value[:20]!r}")

    def _fraction(self) -> sympy.Expr:
        num, den = self._group(), self._group()
        if den == 0:
            raise UnsafeAnswerError("division by zero")
        return num / den

    def _root(self, spelling: str) -> sympy.Expr:
        index: sympy.Expr = sympy.Integer(2)
        if spelling == "\\sqrt" and self.next_is("["):
            self.take("[")
            index = self.expr()
            self.take("]")
            if not (index.is_Integer and 2 <= int(index) <= 12):
                raise UnsafeAnswerError("root index must be an integer 2..12")
        if spelling == "sqrt":
            self.take("(")
            arg = self.expr()
            self.take(")")
        else:
            arg = self._group() if self.next_is("{") else self.primary()
        return sympy.root(arg, index)

    def _group(self) -> sympy.Expr:
        self.take("{")
        inner = self.expr()
        self.take("}")
        return inner

    @staticmethod
    def _starts_primary(tok: tuple[str, str]) -> bool:
        return tok[0] == "num" or tok[1] in ("(", "{", "\\pi", "pi", "\\frac", "\\sqrt", "sqrt")


def _safe_pow(base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
    """``base ** exponent`` only for small rational exponents and results below ~10**300."""
    if not exponent.is_Rational or abs(exponent.p) > 12 or exponent.q > 12:
        raise UnsafeAnswerError("exponent must be a small rational number")
    magnitude = abs(complex(sympy.N(base, 15)))
    if magnitude > 0 and abs(math.log10(magnitude)) * abs(float(exponent)) > MAX_POWER_DIGITS:
        raise UnsafeAnswerError("power too large")
    if magnitude == 0 and exponent < 0:
        raise UnsafeAnswerError("division by zero")
    return sympy.Pow(base, exponent)


def parse_answer(answer: str) -> sympy.Expr:
    """Parse an answer string (no ``\\boxed``) into a sympy number; raises UnsafeAnswerError."""
    tokens = tokenize(normalize(answer))
    if not tokens:
        raise UnsafeAnswerError("empty answer")
    parser = _Parser(tokens)
    value = parser.expr()
    rest = parser.peek()
    if rest is not None:
        raise UnsafeAnswerError(f"unexpected {rest[1][:20]!r} after the expression")
    return value


def equivalent(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Exact equivalence of two parsed answers (see the module docstring)."""
    diff = a - b
    if abs(complex(sympy.N(diff, 50))) > 1e-12:
        return False
    if sympy.simplify(diff) == 0:
        return True
    return abs(complex(sympy.N(diff, 60))) < 1e-40


def grade(answer: str | None, ground_truth: str) -> bool:
    """True iff ``answer`` parses safely and equals ``ground_truth``; never raises on model text."""
    if answer is None:
        return False
    try:
        return equivalent(parse_answer(answer), parse_answer(ground_truth))
    except (UnsafeAnswerError, ZeroDivisionError, OverflowError, TypeError, ValueError):
        return False


def last_boxed(text: str, max_chars: int = 512) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces, at most ``max_chars``), else None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            for j in range(i, min(len(text), i + max_chars + 2)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(response: str) -> str | None:
    """The graded part of a final response: last ``\\boxed{}``, else the last non-empty line (<= 512 chars)."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    for line in reversed(response[-8192:].splitlines()):
        if line.strip():
            return line.strip()[:512]
    return None
