"""Why tests/tinker/test_rl_color_square.py differs run to run: its loop (tests/tinker/rl_loop.py), instrumented.

    python benchmarks/tinker_rl_study.py OUT_DIR warm                     # the test's warm start, into OUT_DIR/warm
    python benchmarks/tinker_rl_study.py OUT_DIR TAG STEPS [nocache] [serial] [stopat]

One torch thread. Each step's record (``OUT_DIR/TAG.jsonl``): reward, datums trained on (``data``), grad norm, the
sampled logprobs (mean, min, the first token's as an entropy estimate), the share of replies that are a colour
word, the largest trainer-vs-sampler logprob gap, hashes of the sampled tokens (``tok_hash``) and of tokens with
logprobs (``hash``: two runs are bit-identical where these are equal), the engine's reused prefix columns; an eval
every 10 steps. ``nocache``: the engine's prefix-KV cache off; ``serial``: one sample request at a time (nothing
batched by arrival); ``stopat``: stop at the first eval >= 0.9. Results of 2026-12-05 (2 shared CPU cores):
``benchmarks/results/tinker_rl_study/`` (d1/d2: as the test runs, n1/n2: nocache, s1/s2: nocache serial, 3 steps
each; f1/f2: as the test runs, 100 steps; f3: nocache serial, stopped at step 58 for time), written by an earlier
form of this script that also logged a few more fields (``ratio_max_mean``, ``loss``, ``top_answers``).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "tinker"), str(ROOT / "tests"), str(ROOT)]
COLOURS = ("red", "green", "blue", "yellow")


def build_warm_start(out: Path) -> None:
    """The test's ``color_square_warm_start`` (tests/conftest.py): the recipe's SFT only, saved to ``out/warm``."""
    from vlrl.models.build import cached_model_dir
    from vlrl.models.load import load_processor
    from vlrl.train.config import load_config
    from vlrl.train.loop import train

    cfg = load_config("color_square_rl", ["run.steps=0", f"run.out={out / 'warm_run'}", "run.progress=False"])
    captured: dict = {}
    train(cfg, on_start=lambda model: captured.update(model=model))
    captured["model"].save_pretrained(out / "warm")
    load_processor(cached_model_dir(cfg.model.arch, cfg.model.size, seed=cfg.model.seed)).save_pretrained(out / "warm")


def _digest(value) -> str:
    return hashlib.sha1(json.dumps(value).encode()).hexdigest()[:10]


def _sample(sampler, episodes, params, serial: bool) -> list[list]:
    """Each row's completions; ``serial``: each request answered before the next is sent."""
    out = []
    for (mi, _), row_params in zip(episodes, params, strict=True):
        if serial:
            futures = []
            for p in row_params:
                futures.append(sampler.sample(mi, 1, p))
                futures[-1].result()
        else:
            futures = [sampler.sample(mi, 1, p) for p in row_params]
        out.append([f.result().sequences[0] for f in futures])
    return out


def _datums(groups, n_tokens: int):
    """The loop's datums (tests/tinker/rl_loop.py) and, per datum, (offset, sampler logprobs) to compare."""
    from tinker import types

    from vlrl.tinker.client import append_tokens

    data, sent = [], []
    for mi, rendered, seqs, _rewards, adv in groups:
        if not any(adv):
            continue
        p = len(rendered.token_ids)
        for s, a in zip(seqs, adv, strict=True):
            toks = list(s.tokens)
            inputs = {
                "target_tokens": list(rendered.token_ids[1:]) + toks,
                "logprobs": [0.0] * (p - 1) + list(s.logprobs),
                "advantages": [0.0] * (p - 1) + [float(a) / n_tokens] * len(toks),
            }
            data.append(types.Datum(model_input=append_tokens(mi, toks[:-1]), loss_fn_inputs=inputs))
            sent.append((p - 1, list(s.logprobs)))
    return data, sent


def _serve(out: Path, nocache: bool):
    """The test's server on ``out/warm`` (the recipe's ``lr_scale`` and micro-batch size), the engine's prefix-KV
    cache off with ``nocache``, and an SDK client of it: ``(recipe config, engine, running server, client)``."""
    import tinker

    from vlrl.engines.reuse import PrefixCache
    from vlrl.tinker.server import build_service, serve_in_thread
    from vlrl.tinker.service import ServiceConfig
    from vlrl.train.config import load_config

    cfg = load_config("color_square_rl", [])
    service = build_service(
        ServiceConfig(
            base_model=str(out / "warm"),
            model_name="warm",
            lr_scale=dict(cfg.optim.lr_scale),
            micro_batch_size=cfg.optim.micro_batch_size,
        )
    )
    engine = service.pool.engine
    if nocache:
        engine._prefix = PrefixCache(0)  # the study's one reach inside: no public switch for the cache
    running = serve_in_thread(service)
    client = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
    return cfg, engine, running, client


def _params(base: int) -> list[list]:
    """8 rows x 8 requests' sampling params, seeded as the loop seeds them (``turn_seed`` of ``base``, row, repeat)."""
    from tinker import types

    from vlrl.rollout.generator import turn_seed

    return [
        [types.SamplingParams(max_tokens=4, temperature=1.0, seed=turn_seed(base, g, r, 0)) for r in range(8)]
        for g in range(8)
    ]


def _score(rows, episodes, sampled, tok) -> tuple[list[tuple], list[str]]:
    """Per row ``(model input, rendered prompt, sequences, rewards, GRPO advantages)``, and all completions' texts."""
    import numpy as np
    import rl_loop

    groups, texts = [], []
    for row, (mi, rendered), seqs in zip(rows, episodes, sampled, strict=True):
        tx = [tok.decode(s.tokens, skip_special_tokens=True) for s in seqs]
        texts += tx
        rewards = np.array([rl_loop._reward(row, t) for t in tx])
        groups.append((mi, rendered, seqs, rewards, rl_loop._grpo(rewards)))
    return groups, texts


def _update(tc, adam, groups: list[tuple]) -> tuple[int, float, float | None]:
    """The loop's update on ``groups`` (``importance_sampling``, then ``optim_step``): the datums trained on, the
    grad norm and the largest |trainer - sampler| logprob over the sampled tokens (None: nothing trained)."""
    import numpy as np

    seqs_all = [s for g in groups for s in g[2]]
    data, sent = _datums(groups, sum(len(s.tokens) for s in seqs_all))
    grad_norm, gap = 0.0, None
    if data:
        fb = tc.forward_backward(data, "importance_sampling").result()
        gap = max(
            float(np.max(np.abs(np.asarray(r["logprobs"].tolist())[off : off + len(q)] - np.asarray(q))))
            for (off, q), r in zip(sent, fb.loss_fn_outputs, strict=True)
        )
        grad_norm = (tc.optim_step(adam).result().metrics or {}).get("grad_norm", 0.0)
    return len(data), grad_norm, gap


def _record(step: int, groups: list[tuple], texts: list[str], data: int, grad_norm: float, gap: float | None) -> dict:
    """A step's record up to ``tok_hash`` (the module docstring lists its fields)."""
    import numpy as np

    seqs_all = [s for g in groups for s in g[2]]
    lps = [x for s in seqs_all for x in s.logprobs]
    words = [t.strip().lower().replace("<answer>", "").replace("</answer>", "") for t in texts]
    return {
        "step": step,
        "reward": float(np.mean([g[3].mean() for g in groups])),
        "data": data,
        "grad_norm": grad_norm,
        "mean_lp": float(np.mean(lps)),
        "first_tok_H_est": -float(np.mean([s.logprobs[0] for s in seqs_all])),
        "min_lp": float(np.min(lps)),
        "colour_word": float(np.mean([w in COLOURS for w in words])),
        "max_abs_logp_mismatch": gap,
        "hash": _digest([[list(s.tokens), [float(x) for x in s.logprobs]] for s in seqs_all]),
        "tok_hash": _digest([list(s.tokens) for s in seqs_all]),
    }


def study(out: Path, tag: str, steps: int, *, nocache: bool, serial: bool, stop_at: bool) -> None:
    """``steps`` steps of the test's loop from ``out/warm``, each one's record printed and written to
    ``out/TAG.jsonl``."""
    import rl_loop
    from tinker import types

    from vlrl.data.tickets import eval_seeds, make_rows, train_seeds
    from vlrl.render.embedded import EmbeddedRenderer

    cfg, engine, running, client = _serve(out, nocache)
    renderer = EmbeddedRenderer.from_pretrained(out / "warm")
    tok, log = renderer.tokenizer, (out / f"{tag}.jsonl").open("w")

    def emit(entry: dict) -> None:
        print(json.dumps(entry), flush=True)
        log.write(json.dumps(entry) + "\n")
        log.flush()

    try:
        tc = client.create_lora_training_client(base_model="warm", rank=0).result()
        train = make_rows(cfg.data.env, train_seeds(cfg.data.train_rows, cfg.run.seed), dict(cfg.data.extras))
        evals = make_rows(cfg.data.env, eval_seeds(cfg.data.eval_rows), dict(cfg.data.extras))
        o = cfg.optim
        adam = types.AdamParams(
            learning_rate=o.lr, beta1=o.betas[0], beta2=o.betas[1], eps=1e-8, grad_clip_norm=o.grad_clip
        )

        def sampler_at(step: int):
            path = tc.save_weights_for_sampler(f"step-{step}").result().path
            return client.create_sampling_client(model_path=path).result()

        sampler = sampler_at(0)
        emit({"step": 0, "eval": rl_loop.evaluate(sampler, evals, renderer, cfg.rollout.max_tokens)})
        t0 = time.time()
        for step in range(steps):
            rows = [train[(step * 8 + i) % len(train)] for i in range(8)]
            episodes = [rl_loop._episode(row, renderer) for row in rows]
            params = _params(cfg.run.seed * 1_000_003 + step)
            reused = engine.stats["reused_columns"]
            groups, texts = _score(rows, episodes, _sample(sampler, episodes, params, serial), tok)
            data, grad_norm, gap = _update(tc, adam, groups)
            sampler = sampler_at(step + 1)
            entry = _record(step + 1, groups, texts, data, grad_norm, gap)
            entry.update(reused_cols=engine.stats["reused_columns"] - reused, t=round(time.time() - t0, 1))
            if (step + 1) % 10 == 0 or step + 1 == steps:
                entry["eval"] = rl_loop.evaluate(sampler, evals, renderer, 4)
            emit(entry)
            if stop_at and entry.get("eval", -1) >= 0.9:
                break
    finally:
        client.close("success").result(timeout=30)
        running.stop()


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    if argv[1:] == ["warm"]:
        build_warm_start(out)
        return
    flags = set(argv[3:])
    study(out, argv[1], int(argv[2]), nocache="nocache" in flags, serial="serial" in flags, stop_at="stopat" in flags)


if __name__ == "__main__":
    main(sys.argv[1:])
