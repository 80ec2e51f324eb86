"""Golden files: a corrupt or truncated file is named by path and line — by the parser, by
``vlrl golden check`` (one line, status 1) — never a bare ValueError or a silent pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vlrl.cli import main
from vlrl.golden.files import GoldenFormatError, golden_path, parse_golden

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
SOURCE = golden_path(GOLDEN, "qwen2_vl", "single_image")


def corruptions(text: str) -> dict[str, tuple[str, int]]:
    """name -> (corrupted text, the line the error must name)."""
    lines = text.splitlines()
    cut = lines.index("---")
    body = cut + 5  # a token row, 1-based line cut + 6
    return {
        "truncated mid-row": ("\n".join(lines[:body]) + "\n" + lines[body][:9], body + 1),
        "truncated at a row boundary": ("\n".join(lines[:-3]) + "\n", len(lines) - 3),
        "header only": ("\n".join(lines[:cut]) + "\n", cut),
        "mask garbled": (
            "\n".join(lines[:body] + [lines[body].replace("  -  ", "  ?  ", 1)] + lines[body + 1 :]),
            body + 1,
        ),
        "id not a number": (
            "\n".join(lines[:body] + [lines[body].replace("  -  ", "  -  x", 1)] + lines[body + 1 :]),
            body + 1,
        ),
    }


@pytest.mark.parametrize("case", sorted(corruptions(SOURCE.read_text(encoding="utf-8"))))
def test_parser_names_path_and_line(case):
    text, line = corruptions(SOURCE.read_text(encoding="utf-8"))[case]
    with pytest.raises(GoldenFormatError) as err:
        parse_golden(text, SOURCE)
    assert err.value.line == line and str(err.value).startswith(f"{SOURCE}:{line}: "), str(err.value)


def test_golden_check_names_the_corrupt_file(tmp_path, capsys, monkeypatch):
    import vlrl.golden.cli

    folder = tmp_path / "golden"
    target = golden_path(folder, "qwen2_vl", "single_image")
    target.parent.mkdir(parents=True)
    shutil.copy(SOURCE, target)
    argv = ["golden", "check", "--dir", str(folder), "--arch", "qwen2_vl", "--scenario", "single_image"]
    rendered = list(vlrl.golden.cli.generate(["qwen2_vl"], ["single_image"]))
    monkeypatch.setattr(vlrl.golden.cli, "generate", lambda *a: iter(rendered))  # render once, check many
    assert main(argv) == 0
    capsys.readouterr()
    for case, (text, line) in corruptions(SOURCE.read_text(encoding="utf-8")).items():
        target.write_text(text, encoding="utf-8")
        assert main(argv) == 1, case
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [err[0]] and f"{target}:{line}: " in err[0], (case, err)
    target.write_bytes(b"\xff\xfe" + SOURCE.read_bytes())
    assert main(argv) == 1 and f"{target}:1: not UTF-8" in capsys.readouterr().err
