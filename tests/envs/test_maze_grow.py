"""A maze model's language model deepened from trained weights (vlrl.envs.maze_models.grow_text_layers).

What must hold: the grown model computes what it was grown from (each added layer adds exact zeros to the residual
stream), the added layers can learn (their zeroed projections get gradients), the config and the manifest say the
new depth, and a wrong request is refused. ~10 s on CPU (the tiny maze model: 2 layers of width 64).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlrl.envs.maze_models import grow_text_layers, start_checkpoint

ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    src = Path(start_checkpoint("qwen2_5_vl", "tiny", "fan_in"))
    return src, grow_text_layers(src, tmp_path_factory.mktemp("grown") / "g5", 5)


def test_each_layer_is_followed_by_zeroed_copies_of_itself(grown):
    src, dst = grown
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    text = json.loads((dst / "config.json").read_text())["text_config"]
    assert text["num_hidden_layers"] == 5 and len(text["layer_types"]) == 5
    # 3 more over 2 layers: layer 0 then two copies of it, layer 1 then one copy
    for new, (old, zero) in enumerate([(0, False), (0, True), (0, True), (1, False), (1, True)]):
        names = [k.removeprefix(f"model.layers.{old}.") for k in before if k.startswith(f"model.layers.{old}.")]
        for name in names:
            got, was = after[f"model.layers.{new}.{name}"], before[f"model.layers.{old}.{name}"]
            assert torch.equal(got, torch.zeros_like(was) if zero and name in ZEROED else was), (new, name)
    assert not any(k.startswith("model.layers.5.") for k in after)
    assert all(torch.equal(after[k], t) for k, t in before.items() if not k.startswith("model.layers."))
    manifest = json.loads((dst / "vlrl_model.json").read_text())
    added = sum(
        t.numel() for k, t in after.items() if k.startswith(("model.layers.1.", "model.layers.2.", "model.layers.4."))
    )
    assert manifest["text_layers"] == 5 and manifest["grown_from"] == 2
    assert manifest["n_params"] == json.loads((src / "vlrl_model.json").read_text())["n_params"] + added


def test_the_grown_model_computes_what_it_grew_from_and_its_new_layers_learn(grown):
    from vlrl.checks.logprobs import full_forward_logprobs
    from vlrl.envs.maze_text import make_maze2d
    from vlrl.models.load import load_model
    from vlrl.render.embedded import EmbeddedRenderer

    src, dst = grown
    messages, _ = make_maze2d("7x7", {}, 3).init()
    renderer = EmbeddedRenderer.from_pretrained(src)
    prompt = renderer.render(messages)
    reply = renderer.tokenizer.encode("<action>up</action>", add_special_tokens=False)
    old, new = load_model(src), load_model(dst)
    assert len(new.model.language_model.layers) == 5
    want, got = (full_forward_logprobs(m, prompt, reply, 1.0) for m in (old, new))
    assert torch.equal(got, want)  # not close: equal, the added layers add exact zeros
    # one backward: the zeroed projections of an added layer get gradients, so training gives them a use
    new.train()
    ids = torch.tensor([list(prompt.token_ids) + reply])
    out = new(input_ids=ids, pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw, labels=ids)
    out.loss.backward()
    added = new.model.language_model.layers[1]
    assert added.self_attn.o_proj.weight.grad.abs().sum() > 0 and added.mlp.down_proj.weight.grad.abs().sum() > 0


def test_fewer_layers_or_sharded_weights_are_refused(grown, tmp_path):
    src, _ = grown
    with pytest.raises(ValueError, match="from 2 to 1 text layers"):
        grow_text_layers(src, tmp_path / "g1", 1)
    assert not (tmp_path / "g1").exists()
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(ValueError, match="no single model.safetensors"):
        grow_text_layers(tmp_path / "sharded", tmp_path / "g3", 3)


def test_a_level_trains_from_grown_weights_with_agreement_held(grown, tmp_path):
    """SFT then one GRPO step (agreement checked, ``run.agreement=stop``) from the grown model: the added layers'
    zeroed projections move, and the level's weights keep the depth."""
    from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

    from vlrl.envs.maze_curriculum import LevelPlan, train_level

    _, dst = grown
    plan = LevelPlan("5x5", 600, 600, overrides=(*cpu_overrides(), "sft.steps=2", "run.steps=1"), sft_pool=1)
    result = train_level(plan, tmp_path / "mc", model_path=str(dst))
    assert result.sft_steps == 2 and result.rl_steps == 1
    checked = [json.loads(line) for line in (tmp_path / "mc" / "agreement.jsonl").read_text().splitlines()]
    assert checked and not any(row["breached"] for row in checked)  # the engine and the trainer agree on it
    assert 'agreement = "stop"' in (tmp_path / "mc" / "config.toml").read_text()
    trained = load_file(Path(result.weights) / "model.safetensors")
    assert trained["model.layers.1.self_attn.o_proj.weight"].abs().sum() > 0
    assert trained["model.layers.4.mlp.down_proj.weight"].abs().sum() > 0
    assert json.loads((Path(result.weights) / "config.json").read_text())["text_config"]["num_hidden_layers"] == 5


def test_the_command_line_grows_only_weights_it_is_given(tmp_path, capsys):
    from bench_script import load  # tests/envs is on sys.path (as maze_cpu)

    mod = load("maze_curriculum.py", "maze_curriculum_cli")
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path / "mc"), "--plan", "5x5:1:0", "--grow-text-layers", "4"])
    assert "--grow-text-layers deepens the model of --weights: name one" in capsys.readouterr().err
    assert not (tmp_path / "mc").exists()  # nothing ran


def test_the_command_line_grows_the_start_beside_the_runs_directory(grown, tmp_path, monkeypatch):
    """Not inside it: ``lease.sh`` packs the newest weights under the run's directory and tars the rest, so a grown
    start there would travel back as weights. The levels' training is stood in for (the test above trains one)."""
    from bench_script import load  # tests/envs is on sys.path (as maze_cpu)

    from vlrl.envs.maze_curriculum import EvalResult, LevelResult

    src, _ = grown
    mod, seen = load("maze_curriculum.py", "maze_curriculum_cli"), []

    def level(plan, out, model_path):
        seen.append(model_path)
        evals = (EvalResult("after_sft", 0, 1, 0.0, 1.0),)
        return LevelResult(plan.level, str(out), 0, 0, 0, 0.0, 0.0, evals, model_path)

    monkeypatch.setattr(mod, "train_level", level)
    out = tmp_path / "mc"
    mod.main(["--out", str(out), "--plan", "5x5:1:0", "--weights", str(src), "--grow-text-layers", "3"])
    assert seen == [str(tmp_path / "mc.grown")]
    assert json.loads((tmp_path / "mc.grown" / "config.json").read_text())["text_config"]["num_hidden_layers"] == 3
    assert not list(out.glob("**/*.safetensors"))
