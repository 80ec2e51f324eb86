"""Replay the maze2d GPU run up to its first RL rollout and save the SFT'd weights and the worst
trajectory (with its tensors) under $OUT, to study the disagreement off the GPU."""
import os, sys, torch
from vlrl.train.config import load_config
from vlrl.train.run import Run
from vlrl.train.loop import sft
from vlrl.checks.agreement import batch_agreement

out = os.environ["OUT"]
cfg = load_config("maze2d", ["run.out=/tmp/dump", "run.progress=False", "sft.steps=40", "sft.rows_per_step=16",
                             "run.steps=6", "rollout.rows_per_step=8", "data.eval_rows=16", "run.eval_every=0",
                             'data.extras={"max_turns":20}'])
run = Run(cfg)
run.evaluate(0, "before")
sft(run)
trajs = run.rollout(run.next_rows(cfg.rollout.rows_per_step), seed=cfg.run.seed * 1_000_003 + 0)
batch = run.collate(trajs)
old = run.trainer.logprobs(batch)
rep = batch_agreement(batch, old)
print(rep.overall, rep.worst[:3], flush=True)
worst = rep.worst[0].uid
t = next(x for x in trajs if x.uid == worst)
torch.save(t, f"{out}/traj.pt")
torch.save({k: v.detach().cpu() for k, v in run.model.state_dict().items()}, f"{out}/model.pt")
# the engine's own weights too: they should be the same (verified sync), saved to prove it
print("engine==trainer", all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(run.engine.model.state_dict().values(), run.model.state_dict().values())))
