"""Hostile action text for env conformance, and a sentinel that notices code execution.

Two sources of hostile text: a fixed corpus (always run; the megabyte-long cases live here so
they are never skipped) and hypothesis-generated mixtures of dangerous fragments (when hypothesis
is installed). Canary payloads would create a file or set a flag if anything executed them.

:class:`ExecutionSentinel` uses ``sys.addaudithook`` (hooks cannot be removed, so one hook is
installed per process and switched on only around ``env.step`` calls, in the calling thread). It
records code compiled from a string being executed (``eval``/``exec`` of text: the code object's
file name is ``<string>`` or similar), process spawning, sockets, file writes and deletions, and
imports of the canary module. Module imports (real files) and ``ast.literal_eval`` (compile
without exec) are not execution of model text and are not flagged.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CANARY_MODULE = "vlrl_canary_module_never_exists"
CANARY_FLAG = "vlrl_canary_flag"

# A table of strings: one per line would be 55 lines of noise.
# fmt: off
FRAGMENTS = [
    "", " ", "\n", "\t", "\x00", "\x1b[2J", "\r\n", "\u202e", "\ufeff", "\U0001f600", "\udcff", "é", "\u0301",
    "<action>", "</action>", "<action>left</action>", "<action>STOP</action>", "<action>", "<answer>",
    "</answer>", "<answer>red</answer>", "<tool_call>", "</tool_call>", '{"name": "calc_score", "arguments": ',
    '{"answer": "', '"}}', "{", "}", "[", "]", "(", ")", "('move', 0)", "('stop', 'stop')", "('move', True)",
    "('move', 1e308)", "\\boxed{", "\\frac{", "\\sqrt[", "9^9^9^9", "1/0", "```python\n", "```", "Action:",
    "<|begin_of_box|>", "<|im_end|>", "<think>", "__import__('os').system('true')", "eval(", "exec(",
    "().__class__.__base__.__subclasses__()", "lambda: 0", "\\x00", "%s%s%n", "{0.__init__}", "' OR 1=1 --",
]
# fmt: on


def canary_payloads(canary_dir: Path) -> list[str]:
    """Texts that leave a trace (a file in ``canary_dir``, a builtins flag, an import) if executed."""
    f1, f2 = canary_dir / "canary_open", canary_dir / "canary_pathlib"
    return [
        f"__import__('builtins').__setattr__('{CANARY_FLAG}', 1)",
        f"open({str(f1)!r}, 'w').write('x')",
        f"__import__('pathlib').Path({str(f2)!r}).write_text('x')",
        f"__import__('{CANARY_MODULE}')",
        f"<action>__import__('{CANARY_MODULE}')</action>",
        f"('move', __import__('{CANARY_MODULE}'))",
        f'<tool_call>{{"name": "calc_score", "arguments": {{"answer": "__import__(\'{CANARY_MODULE}\')"}}}}'
        "</tool_call>",
        f"\\boxed{{__import__('{CANARY_MODULE}')}}",
        f"```python\nimport {CANARY_MODULE}\n```",
    ]


def fixed_corpus(canary_dir: Path) -> list[str]:
    """The always-run hostile texts: empty, huge, control characters, unclosed tags, canaries."""
    mib = 1 << 20
    return [
        "",
        " " * 10,
        "\x00" * 100,
        "a" * mib,
        "<action>" * (mib // 8),
        "<tool_call>{" * (mib // 12),
        "\\boxed{" * (mib // 7),
        "(" * mib,
        "{" * (mib // 2) + "}" * (mib // 2),
        "`" * 100_000,
        "<action>left</action>" * 10_000,
        "<answer>" * 5000 + "red",
        "[" * 5000 + "]" * 5000,
        "\U0001f600" * 50_000,
        "\u202e<action>left</action>",
        "<ACTION> Right </ACTION>",
        "<action>left",
        "<action><action>up</action></action>",
        "('move', 0, 1)",
        "('move', -1)",
        "('stop', 'done')",
        "('fly', 1)",
        "\\boxed{" + "(" * 500 + "1" + ")" * 500 + "}",
        "\\boxed{9^{9^{9^{9}}}}",
        '<tool_call>{"name": "calc_score", "arguments": "' + "[" * 3000 + '"}</tool_call>',
        '<tool_call>{"function": {"name": "calc_score", "arguments": {"answer": null}}}</tool_call>',
        *canary_payloads(canary_dir),
    ]


def hypothesis_texts(n: int) -> list[str]:
    """``n`` hypothesis-generated hostile texts (derandomized: the same ``n`` gives the same texts).

    Returns [] if hypothesis is not installed (the fixed corpus still runs).
    """
    if n <= 0:
        return []
    try:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st
    except ImportError:
        return []
    fragment = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=24))
    mixture = st.lists(fragment, max_size=16).map("".join)
    repeated = st.tuples(st.sampled_from(FRAGMENTS[13:]), st.integers(1, 20_000)).map(lambda t: t[0] * t[1])
    texts: list[str] = []

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(mixture, mixture, repeated))
    def collect(text: str) -> None:
        texts.append(text)

    collect()
    return texts[:n]


# ---------------------------------------------------------------- the sentinel

_WATCHED = {
    "os.system",
    "subprocess.Popen",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "socket.connect",
    "socket.bind",
    "ctypes.dlopen",
    "shutil.rmtree",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.truncate",
    "os.kill",
    "pty.spawn",
    "webbrowser.open",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_state = threading.local()
_installed = False
_install_lock = threading.Lock()


def _describe(event: str, args: tuple[Any, ...]) -> str | None:
    """A description of an audit event that counts as side effect or execution, else None."""
    if event == "exec":
        filename = getattr(args[0], "co_filename", "")
        return f"exec of code compiled from a string ({filename})" if filename.startswith("<") else None
    if event == "import":
        return f"import of {args[0]}" if args and args[0] == CANARY_MODULE else None
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and mode is None and flags & _WRITE_FLAGS
        )
        return f"open({str(path)[:80]!r}, {mode!r}) for writing" if writes else None
    if event in _WATCHED:
        return f"{event}{tuple(str(a)[:60] for a in args)}"
    return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    events = getattr(_state, "events", None)
    if events is None:
        return
    found = _describe(event, args)
    if found is not None:
        events.append(found)


class ExecutionSentinel:
    """Collects suspicious audit events while :meth:`watch` is active in this thread."""

    def __init__(self) -> None:
        global _installed
        with _install_lock:
            if not _installed:
                sys.addaudithook(_hook)
                _installed = True
        self.events: list[str] = []

    @contextmanager
    def watch(self) -> Iterator[list[str]]:
        """Record into a fresh list for the duration of the block (also appended to ``self.events``)."""
        found: list[str] = []
        previous = getattr(_state, "events", None)
        _state.events = found
        try:
            yield found
        finally:
            _state.events = previous
            self.events.extend(found)


def canary_traces(canary_dir: Path) -> list[str]:
    """Traces a canary payload would leave if it had been executed."""
    import builtins

    traces = [f"file {p.name} exists" for p in sorted(canary_dir.glob("canary_*"))]
    if hasattr(builtins, CANARY_FLAG):
        traces.append(f"builtins.{CANARY_FLAG} was set")
    if CANARY_MODULE in sys.modules:
        traces.append(f"module {CANARY_MODULE} was imported")
    return traces
