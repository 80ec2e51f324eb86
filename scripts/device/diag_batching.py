"""GPU: does rollout-vs-trainer agreement depend on batching (rows of different lengths), and on
the attention implementation? Random tiny model, stop strings to make rows finish at different times."""
import sys, torch
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.engines.embedded import EmbeddedEngine
from vlrl.render.embedded import EmbeddedRenderer
from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutGenerator, RolloutConfig
from vlrl.data.tickets import make_rows
from vlrl.train.batch import collate, CollateSpec
from vlrl.train.forward import policy_forward
from vlrl.checks.agreement import batch_agreement

p = cached_model_dir("qwen2_5_vl", "tiny")
r = EmbeddedRenderer.from_pretrained(p)
ROWS, TURNS = int(sys.argv[1]), int(sys.argv[2])
for attn in sys.argv[3:]:
    model = load_model(p, device="cuda", dtype=torch.float32)
    model.set_attn_implementation(attn) if hasattr(model, "set_attn_implementation") else None
    e = EmbeddedEngine(model, r.tokenizer)
    for stop, tokens in ((("e", "a"), 8),):
        g = RolloutGenerator(r, e, RolloutConfig(sampling=SamplingParams(max_tokens=tokens, stop=stop), repeats=2,
                                                 max_turns=TURNS, progress=False))
        trajs = g.run(make_rows("maze2d/easy", list(range(ROWS))))
        b = collate(trajs, CollateSpec.from_model(model))
        with torch.no_grad():
            out = policy_forward(model, b, with_entropy=False)
            small = [policy_forward(model, sub, with_entropy=False) for sub in b.split(4)]
        import torch as T
        diff_small = max(float(((o.logprobs.cpu() - sub.old_logprobs) * sub.loss_mask).abs().max())
                         for o, sub in zip(small, b.split(4)))
        print("trainer in micro-batches of 4: max", diff_small, "patches", int(b.image_grid_thw.prod(-1).sum()), flush=True)
        rep = batch_agreement(b, out)
        lens = sorted({len(t.token_ids) for t in trajs})
        print(attn, stop, "max", rep.overall.max_abs, "mean", rep.overall.mean_abs, "n_lens", len(lens),
              "bad turns", [(t.turn, round(t.stats.max_abs, 4)) for t in rep.turns if t.stats.max_abs > 1e-4], flush=True)
