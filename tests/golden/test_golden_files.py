"""Every golden scenario, for every architecture, reproduces its file; regen reproduces them byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlrl.golden.files import golden_diff, render_scenario
from vlrl.golden.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_golden(tiny, vlrl_golden, arch, scenario):
    bundle = tiny(arch)
    vlrl_golden.check(
        f"{arch}/{scenario}.golden",
        render_scenario(arch, scenario, bundle.renderer, bundle.engine.max_context),
        fix=f"`vlrl golden regen --arch {arch} --scenario {scenario}`",
    )


def test_regen_command_reproduces_the_files_byte_for_byte(tmp_path, vlrl_model_dir):
    from vlrl.cli import main

    vlrl_model_dir("qwen2_vl")  # the command uses the same checkpoint cache
    assert main(["golden", "regen", "--dir", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.golden"))
    assert written == sorted(p.relative_to(ROOT / "golden") for p in (ROOT / "golden").rglob("*.golden"))
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (ROOT / "golden" / rel).read_bytes(), rel
    assert main(["golden", "check", "--dir", str(tmp_path)]) == 0


def test_diff_names_the_first_divergence_and_mask_changes():
    text = (ROOT / "golden" / "qwen2_5_vl" / "stop_string_eos.golden").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["1"])
    changed = lines[:at] + [lines[at].replace("  1  ", "  0  ", 1)] + lines[at + 1 :]
    report = golden_diff(text, "\n".join(changed) + "\n")
    assert "loss-mask changes at 1 tokens" in report and "1->0" in report
    swapped = lines[:at] + [lines[at + 1], lines[at]] + lines[at + 2 :]
    report = golden_diff(text, "\n".join(swapped) + "\n")
    index = int(lines[at].split()[0])
    assert f"first token divergence at index {index}" in report
