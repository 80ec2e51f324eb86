"""What ``vlrl train`` prints while it runs: one line per step and per evaluation, for a person.

A line reads ``[rl  3/40] reward 0.62 | agree max|Δ| 1.2e-03 (bound 5.0e-02) | 1,840 tok/s | 1.9 s/step | ETA 1:12``.
Lines go to stderr, flushed, on a terminal and in a log file or CI alike (the JSON logs stay the record);
on a terminal one tqdm bar per phase sits under them (the rollout generator's per-batch bars are off in
training). ``run.progress=false`` silences both.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

Phase = Literal["sft", "rl"]


def format_eta(seconds: float | None) -> str:
    """``h:mm:ss`` or ``m:ss``; ``?`` when there is no estimate yet."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_step_line(
    phase: Phase,
    step: int,
    total: int,
    values: dict[str, Any],
    *,
    tokens_per_s: float | None,
    step_s: float | None,
    eta_s: float | None,
) -> str:
    """One step's line: phase, step/total, reward (and SFT's loss), agreement max |Δ| against its bound
    (RL), tokens/s, seconds per step and the phase's ETA. Missing values are left out, never guessed."""
    width = len(str(total))
    head = f"[{phase:<3} {step:>{width}}/{total}]"
    parts: list[str] = []
    if values.get("reward_mean") is not None:
        parts.append(f"reward {values['reward_mean']:.3f}")
    if values.get("loss") is not None:
        parts.append(f"loss {values['loss']:.4f}")
    if values.get("logprob_max_abs_diff") is not None:
        agree = f"agree max|Δ| {values['logprob_max_abs_diff']:.1e}"
        if values.get("agreement_bound") is not None:
            agree += f" (bound {values['agreement_bound']:.1e})"
        parts.append(agree)
    if tokens_per_s is not None:
        parts.append(f"{tokens_per_s:,.0f} tok/s")
    if step_s is not None:
        parts.append(f"{step_s:.1f} s/step")
    parts.append(f"ETA {format_eta(eta_s)}")
    return head + " " + " | ".join(parts)


def format_eval_line(label: str, step: int, reward: float, episodes: int, seconds: float) -> str:
    """An evaluation's line: ``[eval after_sft @ rl 0] reward 0.950 over 20 episodes (3.1 s)``."""
    return f"[eval {label} @ rl {step}] reward {reward:.3f} over {episodes} episodes ({seconds:.1f} s)"


@dataclass
class Progress:
    """The run's console: ``step`` after each SFT/RL step, ``eval`` after each evaluation."""

    totals: dict[str, int]
    enabled: bool = True
    stream: TextIO | None = None  # None: sys.stderr at the time of writing (pytest's capture swaps it)
    _started: dict[str, tuple[float, int]] = field(default_factory=dict)  # phase → (clock, first step)
    _last: dict[str, float] = field(default_factory=dict)
    _bars: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _tty(self) -> bool:
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty())

    def begin(self, phase: Phase, first_step: int) -> None:
        """Start ``phase``'s clock (``first_step``: steps already done, by a resumed run)."""
        now = time.perf_counter()
        self._started[phase] = (now, first_step)
        self._last[phase] = now
        if self.enabled and self._tty() and self.totals.get(phase):
            from tqdm import tqdm

            self._bars[phase] = tqdm(
                total=self.totals[phase], initial=first_step, desc=phase, unit="step", file=self.out, leave=True
            )

    def step(self, phase: Phase, step: int, values: dict[str, Any], tokens: int | None = None) -> str | None:
        """Print step ``step`` (1-based) of ``phase``; returns the line (None when disabled)."""
        now = time.perf_counter()
        if phase not in self._started:
            self.begin(phase, step - 1)
        start, first = self._started[phase]
        step_s = now - self._last.get(phase, start)
        self._last[phase] = now
        done = step - first
        total = self.totals.get(phase, step)
        eta = (now - start) / done * (total - step) if done > 0 else None
        line = format_step_line(
            phase,
            step,
            total,
            values,
            tokens_per_s=tokens / step_s if tokens is not None and step_s > 0 else None,
            step_s=step_s,
            eta_s=eta,
        )
        self._write(line)
        bar = self._bars.get(phase)
        if bar is not None:
            bar.update(1)
            if step >= total:
                bar.close()
                del self._bars[phase]
        return line if self.enabled else None

    def eval(self, label: str, step: int, reward: float | None, episodes: int, seconds: float) -> str | None:
        if reward is None:
            return None
        line = format_eval_line(label, step, reward, episodes, seconds)
        self._write(line)
        return line if self.enabled else None

    def _write(self, line: str) -> None:
        if not self.enabled:
            return
        if self._bars:  # above the bar, which tqdm redraws under it
            from tqdm import tqdm

            tqdm.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
