"""Diagnose a rollout-vs-trainer logprob disagreement on the GPU: SFT a little on maze2d, roll out,
then for the worst trajectory regenerate its worst turn alone and on CPU to locate the cause."""
import json, sys, time, dataclasses
import torch
from vlrl.train.config import load_config
from vlrl.train.run import Run
from vlrl.train.loop import sft
from vlrl.train.forward import policy_forward
from vlrl.checks.agreement import batch_agreement
from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.render.types import RenderedPrompt

cfg = load_config("maze2d", ["run.out=/tmp/diag", "run.progress=False", "sft.steps=%s" % sys.argv[1], "sft.rows_per_step=16",
                             "data.eval_rows=4", 'data.extras={"max_turns":20}', "rollout.rows_per_step=8", "run.samples=0"])
run = Run(cfg)
t0 = time.time(); sft(run); print("sft", time.time() - t0, flush=True)
trajs = run.rollout(run.next_rows(8), seed=1)
batch = run.collate(trajs)
with torch.no_grad():
    out = policy_forward(run.model, batch, with_entropy=False)
rep = batch_agreement(batch, out)
print("overall", rep.overall)
bad = {}
for b, t in enumerate(trajs):
    d = (out.logprobs[b].cpu() - batch.old_logprobs[b]).abs() * batch.loss_mask[b]
    for s in t.turns:
        m = float(d[s.gen_start:s.gen_end].max())
        if m > 1e-3:
            bad.setdefault(t.uid, []).append((s.index, round(m, 4), s.gen_start, s.gen_end - s.gen_start, s.finish_reason))
print("bad turns", json.dumps(bad))
print("lengths", [len(t.token_ids) for t in trajs], "turns", [len(t.turns) for t in trajs])
if bad:
    uid = next(iter(bad)); t = next(x for x in trajs if x.uid == uid); k = bad[uid][0][0]; s = t.turns[k]
    ids = t.token_ids
    n_img = s.images_before
    rows = int(t.image_grid_thw[:n_img].prod(-1).sum())
    prompt = RenderedPrompt(ids[:s.gen_start], t.pixel_values[:rows], t.image_grid_thw[:n_img], t.placeholders[:n_img], t.image_hashes[:n_img])
    gen = list(ids[s.gen_start:s.gen_end - s.eos_appended])
    ref_gpu = full_forward_logprobs(run.engine.model, prompt, gen, 1.0)
    roll = torch.tensor(t.logprobs[s.gen_start - len(t.prompt_ids): s.gen_start - len(t.prompt_ids) + len(gen)])
    print("turn", k, "rollout", roll.tolist())
    print("fullfwd gpu engine-model", ref_gpu.tolist())
    print("trainer", out.logprobs[trajs.index(t), s.gen_start:s.gen_start + len(gen)].tolist())
    cpu_model = run.engine.model.float().cpu()
    print("fullfwd cpu", full_forward_logprobs(cpu_model, prompt, gen, 1.0).tolist())
    print("tokens", gen, "text", repr(t.turns[k].text), "prompt_len", len(prompt.token_ids), "images", n_img)
