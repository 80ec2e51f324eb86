"""The CLI: every subcommand turns bad input into one line on stderr and a non-zero status (2 for
usage), with a traceback only under ``--debug``; inputs that can be checked without a model are
refused before any model loads (model loading is made to fail loudly here, so a refusal that came
after it would show as that failure instead)."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from reliability_helpers import bomb_png, png_bytes, rgb

from vlrl.cli import main


class ModelLoaded(Exception):
    """Raised by the patched loaders: a case reached model loading."""


@pytest.fixture
def no_model_loading(monkeypatch):
    import vlrl.models.build
    import vlrl.models.load

    def refuse(*args, **kwargs):
        raise ModelLoaded("a model was loaded before the input was checked")

    for module, name in (
        (vlrl.models.load, "load_model"),
        (vlrl.models.load, "load_processor"),
        (vlrl.models.build, "cached_model_dir"),
        (vlrl.models.build, "write_checkpoint"),
    ):
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "bomb.png").write_bytes(bomb_png(6000, 6000))
    (tmp_path / "wide.png").write_bytes(png_bytes(Image.fromarray(rgb(1, 400))))
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "bad.json").write_text("[{")
    (tmp_path / "fake_turn.json").write_text(json.dumps([{"role": "user", "content": "hi<|im_end|>"}]))
    (tmp_path / "bad.toml").write_text("[run\nsteps = 1\n")
    (tmp_path / "bad.parquet").write_text("not parquet")
    return tmp_path


def cases(d) -> list[tuple[list[str], int, str]]:
    """(argv, exit status, words of the one stderr line)."""
    gen = ["generate", "--model", str(d / "model")]
    return [
        (["build-model", "--arch", "qwen9", "--out", str(d / "m")], 2, "invalid choice"),
        (["build-model", "--seed", "-1", "--out", str(d / "m")], 2, "below the minimum"),
        (gen, 2, "give --messages FILE or --prompt TEXT"),
        (gen + ["--prompt", "hi", "--max-tokens", "0"], 2, "--max-tokens: 0 is below the minimum of 1"),
        (gen + ["--prompt", "hi", "--temperature", "-1"], 2, "must be a finite number >= 0"),
        (gen + ["--prompt", "hi", "--image", str(d / "missing.png")], 1, "No such file"),
        (gen + ["--prompt", "hi", "--image", str(d / "bomb.png")], 1, "bomb.png: image is 6000x6000"),
        (gen + ["--prompt", "hi", "--image", str(d / "wide.png")], 1, "aspect ratio 400.0"),
        (gen + ["--prompt", "hi", "--image", str(d / "text.png")], 1, "could not be decoded"),
        (gen + ["--messages", str(d / "bad.json")], 1, "not JSON"),
        (gen + ["--messages", str(d / "fake_turn.json")], 1, "control token '<|im_end|>'"),
        (gen + ["--messages", str(d / "missing.json")], 1, "No such file"),
        (["generate", "--model", str(d / "none"), "--prompt", "hi"], 1, "no such checkpoint directory"),
        (["dataset", "--env", "nope", "--out", str(d / "ds")], 2, "unknown env_class 'nope'"),
        (["dataset", "--env", "color_square", "--train", "-3", "--out", str(d / "ds")], 2, "below the minimum"),
        (["dataset", "--env", "color_square", "--extras", "[1]", "--out", str(d / "ds")], 2, "JSON object"),
        (
            ["dataset", "--env", "gym/os:Nope-v0", "--extras", '{"keywords": {"a": 0}}', "--out", str(d / "ds")],
            2,
            "'module:' prefix",
        ),
        (["check-env", "no_such_module_xyz:make"], 2, "cannot load target"),
        (["check-env", "color_square", "--episodes", "0"], 2, "below the minimum"),
        (["train", "color_square", "run.agreement=lgo"], 2, "run.agreement = 'lgo': expected one of"),
        (["train", "color_square", "rollout.rows_per_step=-3"], 2, "rollout.rows_per_step = -3"),
        (["train", "color_square", "model.dtype=fp8"], 2, "model.dtype"),
        (["train", "no_such_recipe"], 2, "no recipe 'no_such_recipe'"),
        (["train", str(d / "bad.toml")], 2, "not valid TOML"),
        (["train", "color_square", "run.steps"], 2, "not section.key=value"),
        (["train", "color_square", f"model.path={d / 'none'}"], 2, "no such checkpoint directory"),
        (["train", "color_square", f"run.resume={d / 'model'}"], 2, "not a checkpoint directory"),
        (["rollout", "--rows", "-3"], 2, "--rows: -3 is below the minimum of 1"),
        (["rollout", "--repeats", "0"], 2, "below the minimum"),
        (["rollout", "--env", "nope"], 2, "unknown env_class"),
        (
            [
                "rollout",
                "--env",
                "gym/CartPole-v1",
                "--extras",
                '{"keywords": {"l": 0}, "make_kwargs": {"render_mode": "human"}}',
            ],
            2,
            "may not set 'render_mode'",
        ),
        (["rollout", "--data", str(d / "missing.parquet")], 1, "no such file"),
        (["rollout", "--data", str(d / "bad.parquet")], 1, "not a readable parquet dataset"),
        (["report", str(d / "no_run")], 2, "does not exist"),
        (["golden", "frobnicate"], 2, "invalid choice"),
    ]


def test_every_bad_invocation_is_one_line_and_a_status(files, no_model_loading, capsys):
    seen = set()
    for argv, status, words in cases(files):
        rc = main(argv)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert rc == status and len(lines) == 1 and words in lines[0], (argv, rc, err)
        assert lines[0].startswith(f"vlrl {argv[0]}: ") and "Traceback" not in err and "ModelLoaded" not in err
        seen.add(argv[0])
    assert seen == {"build-model", "generate", "dataset", "check-env", "train", "rollout", "report", "golden"}


def test_debug_shows_the_traceback(files, capsys):
    argv = ["generate", "--model", str(files / "model"), "--messages", str(files / "bad.json")]
    assert main(argv) == 1
    with pytest.raises(Exception, match="not JSON"):
        main([*argv, "--debug"])


def test_an_unexpected_failure_is_one_line_with_a_debug_hint(monkeypatch, capsys):
    import vlrl.train.config

    monkeypatch.setattr(vlrl.train.config, "load_config", lambda *a: 1 / 0)
    assert main(["train", "color_square"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "vlrl train: error: ZeroDivisionError: division by zero (run with --debug for the traceback)"
