"""The command line as a new user meets it: overrides anywhere, TOML's true/false, every config error before a
model loads, render's message for a lone message, help that names the main job as README does."""

from __future__ import annotations

import pytest

from vlrl.cli import main
from vlrl.errors import BadInputError, ConfigError
from vlrl.train.config import load_config


@pytest.fixture
def no_model_loading(monkeypatch):
    import vlrl.models.build
    import vlrl.models.load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    for module, name in ((vlrl.models.load, "load_model"), (vlrl.models.build, "cached_model_dir")):
        monkeypatch.setattr(module, name, refuse)


def test_overrides_go_anywhere_on_the_train_line(no_model_loading, capsys):
    # a bad value after --report: refused as a config error (status 2), not as an unrecognized argument
    assert main(["train", "color_square", "--report", "run.out=/tmp/x", "run.steps=-1"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized" not in err and "run.steps = -1: must be >= 0" in err, err
    assert main(["train", "--report", "color_square", "run.steps=-1"]) == 2  # the recipe after the flag too
    assert "run.steps = -1" in capsys.readouterr().err
    assert main(["train", "run.steps=-1"]) == 2  # an override alone: the default recipe
    assert "run.steps = -1" in capsys.readouterr().err


def test_true_and_false_are_booleans():
    cfg = load_config("color_square", ["run.image_probe=true", "run.progress=false", "optim.packing=True"])
    assert (cfg.run.image_probe, cfg.run.progress, cfg.optim.packing) == (True, False, True)
    with pytest.raises(ConfigError, match="expected bool"):
        load_config("color_square", ["run.image_probe=yes"])


def test_unknown_lora_targets_are_refused_by_the_config(no_model_loading, capsys):
    with pytest.raises(ConfigError, match=r"\['qkv'\] not a language-model linear layer of qwen2_5_vl; valid: q_proj"):
        load_config("color_square", ["model.lora.rank=4", "model.lora.targets=['q_proj', 'qkv']"])
    assert main(["train", "color_square", "model.lora.targets=['attn']"]) == 2
    assert "['attn'] not a language-model linear layer" in capsys.readouterr().err
    load_config("color_square", ["model.lora.targets=['q_proj', 'down_proj']"])


def test_a_lone_message_is_named_as_such():
    from vlrl.messages import as_list, normalize_messages, prepare_messages

    message = {"role": "user", "content": "hi"}
    with pytest.raises(BadInputError, match=r"messages must be a list of message dicts, got a dict \(one message"):
        prepare_messages(as_list(message))  # what every renderer's render(messages) does
    with pytest.raises(BadInputError, match="list of message dicts, got a str"):
        normalize_messages("hi")
    assert normalize_messages(as_list((message,))) == [message]


def test_help_names_the_main_job_as_readme_does(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    demo = next(line for line in out.splitlines() if line.strip().startswith("demo"))
    train = next(line for line in out.splitlines() if line.strip().startswith("train"))
    assert "main job" not in demo and "main job" in train
    assert "vlrl train color_square --report" in " ".join(out.split())
    assert main(["train", "--help"]) == 0
    assert "anywhere on the line" in capsys.readouterr().out
