"""Training runs as tests: the ``vlrl_train`` fixture runs a recipe into the test's tmp dir.

    @pytest.mark.train
    def test_color_square_learns(vlrl_train):
        run = vlrl_train("color_square")                     # recipe name or TOML, + key=value overrides
        run.assert_learned(0.9)                              # final eval reward
        run.assert_agreement_held()                          # rollout vs trainer logprobs, every step
        run.assert_all_parameters_changed()
        run.assert_images_mattered()                         # with run.image_probe=true

The run's curves, drift histogram and rollout strips are attached to the test's row of the HTML
report (pytest-html), whether it passes or fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest


class TrainedRun:
    """A finished run: its config, summary, run directory and pass criteria as assertions."""

    def __init__(self, cfg, summary: dict, initial: dict, final_model):
        from vlrl.checks.training import RunRecord

        self.cfg, self.summary = cfg, summary
        self.dir = Path(summary["out"])
        self.record = RunRecord.load(self.dir)
        self._initial, self._final = initial, final_model

    def assert_learned(self, threshold: float) -> None:
        from vlrl.checks.training import learned

        learned(self.record, threshold)

    def assert_agreement_held(self) -> None:
        from vlrl.checks.training import agreement_held

        agreement_held(self.record, steps=len(self.record.phase("rl")))

    def assert_images_mattered(self) -> None:
        from vlrl.checks.training import images_mattered

        images_mattered(self.record)

    def assert_all_parameters_changed(self) -> None:
        from vlrl.checks.training import TrainingCheckError, changed_parameters

        trainable = {n for n, p in self._final.named_parameters() if p.requires_grad}
        after = dict(self._final.named_parameters())
        same = changed_parameters({n: t for n, t in self._initial.items() if n in trainable}, after)
        if same:
            raise TrainingCheckError(
                f"{len(same)} of {len(trainable)} trainable parameters never changed: "
                f"{same[:8]}{' …' if len(same) > 8 else ''}"
            )


@pytest.fixture
def vlrl_train(request: pytest.FixtureRequest, tmp_path: Path):
    """``vlrl_train(recipe, *overrides, name="run") -> TrainedRun`` (runs in ``tmp_path / name``)."""
    from pytest_vlrl.report import attach_run

    def run(recipe: str, *overrides: str, name: str = "run") -> TrainedRun:
        from vlrl.train.config import load_config
        from vlrl.train.loop import train

        out = tmp_path / name
        cfg = load_config(recipe, [*overrides, f"run.out={out}", "run.progress=False"])
        attach_run(request, out)
        captured: dict = {}
        summary = train(
            cfg,
            on_start=lambda model: captured.update(
                initial={n: p.detach().clone() for n, p in model.named_parameters()}, model=model
            ),
        )
        return TrainedRun(cfg, summary, captured["initial"], captured["model"])

    return run
