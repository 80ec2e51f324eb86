"""The parts of a training run, built from a :class:`TrainConfig`: model, engine, rollouts, data, logs.

The trainer's model and the engine's are separate copies (as with a real inference server): after every optimizer
step the weights are pushed to the engine and the sync is verified by checksum — never assumed.

**Several processes** (``torchrun``, see ``vlrl.train.distributed``): the policy (and the reference model) is sharded
with FSDP2 (``vlrl.train.fsdp``) over every rank; the engine, evaluation, logs and checkpoint metadata live on rank 0.
Rank 0 rolls out and broadcasts the trajectories; each rank computes logprobs and gradients for its share of the batch.
Why the embedded engine on rank 0, not one per rank: the rollouts are then exactly the one-process run's, so a
distributed step is provably the same step and a checkpoint resumes on any rank count; and the engine is held once.
Rollouts scale with ``rollout.engine=vllm``: rank 0 drives any number of vLLM servers over HTTP (``VLRL_VLLM_URL``).
Either way a weight sync gathers the full state on rank 0 and pushes it.

**LoRA** (``model.lora``, ``vlrl.models.lora``): peft's adapters go into the policy after the engine's and the
reference's copies are taken (the base model); the engine gets the merged weights under the base names, checksummed.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, overload

import torch

from vlrl.algos.diagnostics import advantage_stats
from vlrl.checks.agreement import batch_agreement
from vlrl.checks.bounds import bounds_for
from vlrl.engines.types import SamplingParams
from vlrl.models.checksum import weights_checksum
from vlrl.models.lora import apply_lora, lora_layers, merged_weights
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator, Turns, cap_turns
from vlrl.rollout.io import write_jsonl
from vlrl.train import distributed as D
from vlrl.train.batch import CollateSpec, collate_trained
from vlrl.train.checkpoint import (
    RestoreOptimizer,
    RunState,
    checkpoint_name,
    latest_checkpoint,
    load_checkpoint,
    remove_partial,
    save_checkpoint,
)
from vlrl.train.config import TrainConfig
from vlrl.train.fsdp import full_weights, shard_model
from vlrl.train.master import round_masters_
from vlrl.train.metrics import RunLog
from vlrl.train.trainer import Trainer


class WeightSyncError(RuntimeError):
    """The engine does not serve the trainer's weights after a sync."""


class Run:
    renderer: Any  # rank 0's renderer and engine (embedded or vLLM); None on other ranks
    engine: Any
    _close_engine: Callable[[], None]
    restore_sft_optimizer: RestoreOptimizer | None
    """A mid-SFT checkpoint's SFT optimizer state, for the SFT trainer to load on resume."""

    def __init__(self, cfg: TrainConfig):
        from vlrl.data.tickets import eval_seeds, make_rows, train_seeds
        from vlrl.models.build import cached_model_dir
        from vlrl.models.load import load_model

        self.cfg = cfg
        m = cfg.model
        self.dist = D.init_distributed(m.device)
        self.model_dir = Path(m.path) if m.path else cached_model_dir(m.arch, m.size, seed=m.seed)
        if m.device.startswith("cuda") and m.dtype == "float32":
            # fp32 means fp32: no TF32 in matmuls or convolutions (the vision patch embedding is a conv),
            # or rollout and trainer logprobs drift apart with the batch shape.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.dtype = getattr(torch, m.dtype)  # config.Dtype: float32 or bfloat16
        # Sharded bf16 runs keep fp32 parameters as the master weights and compute in model.dtype
        # (vlrl.train.fsdp); a plain run keeps them in the optimizer (vlrl.train.master).
        masters = self.dist.sharded and cfg.optim.master_weights == "float32"
        dtype = torch.float32 if masters else self.dtype
        model = load_model(self.model_dir, dtype, self.dist.device, attention=m.attention, kernels=m.kernels)
        if masters:
            round_masters_(model, self.dtype)  # the plain run's starting masters (vlrl.train.master)
        self.spec = CollateSpec.from_model(model)
        self.renderer, self.engine, self._close_engine = (
            self._inference_stack(model) if self.dist.is_main else (None, None, lambda: None)
        )
        ref, self._mirror = self._reference(model), self._probe_model(model)  # copies of the base model
        if m.lora is not None:
            apply_lora(
                model, rank=m.lora.rank, alpha=m.lora.alpha, targets=m.lora.targets, vision=m.lora.vision, seed=m.seed
            )
        self._lora = lora_layers(model) if m.lora is not None else {}
        if self.dist.sharded:
            shard_model(model, self.dist, self.dtype)
            if ref is not None:
                shard_model(ref, self.dist, self.dtype)
        self.model = model.train()
        self.trainer = Trainer(self.model, cfg.algo, cfg.optim, ref_model=ref)
        self.train_rows = make_rows(cfg.data.env, train_seeds(cfg.data.train_rows, cfg.run.seed), cfg.data.extras)
        self.eval_rows = make_rows(cfg.data.env, eval_seeds(cfg.data.eval_rows), cfg.data.extras)
        self.state = RunState()
        self.restore_sft_optimizer = None
        self.log = RunLog(cfg.out_dir) if self.dist.is_main else D.NullLog(cfg.out_dir)

    def _inference_stack(self, model):
        if self.cfg.rollout.engine == "embedded":
            from vlrl.engines.embedded import EmbeddedEngine
            from vlrl.models.load import load_processor
            from vlrl.render.embedded import EmbeddedRenderer

            tokenizer = load_processor(self.model_dir).tokenizer
            engine = EmbeddedEngine(copy.deepcopy(model).to(self.dtype).eval(), tokenizer)
            return EmbeddedRenderer.from_pretrained(self.model_dir), engine, engine.close
        if self.cfg.rollout.engine == "vllm":
            from vlrl.vllm.limits import episode_images
            from vlrl.vllm.stack import rollout_stack

            c = self.cfg  # vLLM's limits come from the run: images an episode holds, the model's context
            return rollout_stack(
                self.model_dir,
                mode=c.rollout.vllm_mode,
                max_images_per_prompt=episode_images(c.data.env, c.data.extras, c.rollout.max_turns),
                max_model_len=int(model.config.text_config.max_position_embeddings),
                dtype=c.model.dtype,  # the run's dtype: bf16 runs are served in bf16
                renderer=c.rollout.renderer,
                execution=c.rollout.vllm_execution,
                logprobs_from=c.rollout.vllm_logprobs,
                ban=c.rollout.vllm_ban,
            )
        raise ValueError(f"rollout.engine must be 'embedded' or 'vllm', got {self.cfg.rollout.engine!r}")

    def _probe_model(self, model):
        """A sharded rank has no whole model for vLLM's sync probe: rank 0 keeps a plain copy, loaded at each sync."""
        if not (self.dist.sharded and self.dist.is_main and self.cfg.rollout.engine == "vllm"):
            return None
        return copy.deepcopy(model).to(self.dtype).eval()

    def _reference(self, model):
        """The frozen reference of the KL term: the initial weights (with LoRA, the base model)."""
        if self.cfg.algo.kl_coef <= 0:
            return None
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # ------------------------------------------------------------------ data and rollouts

    def next_rows(self, n: int) -> list:
        rows = [self.train_rows[(self.state.data_position + i) % len(self.train_rows)] for i in range(n)]
        self.state.data_position += n
        return rows

    @overload
    def rollout(
        self,
        rows,
        *,
        seed: int,
        temperature: float | None = None,
        repeats: int | None = None,
        script=None,
        shared: Literal[True] = True,
        max_turns: Turns = None,
    ) -> list: ...
    @overload
    def rollout(
        self,
        rows,
        *,
        seed: int,
        temperature: float | None = None,
        repeats: int | None = None,
        script=None,
        shared: Literal[False],
        max_turns: Turns = None,
    ) -> list | None: ...

    def rollout(
        self,
        rows,
        *,
        seed: int,
        temperature: float | None = None,
        repeats: int | None = None,
        script=None,
        shared: bool = True,
        max_turns: Turns = None,
    ) -> list | None:
        """Episodes of ``rows`` on rank 0's engine (``max_turns``: a cap, or one per row); every rank gets them
        (``shared``), else only rank 0 (None elsewhere)."""
        config, trajs = self.rollout_config(seed, temperature, repeats, max_turns), None
        if self.dist.is_main:
            trajs = RolloutGenerator(self.renderer, self.engine, config).run(rows, script=script)
        return D.broadcast(trajs) if shared else trajs

    def rollout_config(
        self, seed: int, temperature: float | None = None, repeats: int | None = None, max_turns: Turns = None
    ) -> RolloutConfig:
        """The run's rollout settings (``temperature``, ``repeats``: the config's unless given; ``max_turns``: cap)."""
        r = self.cfg.rollout
        sampling = SamplingParams(
            temperature=r.temperature if temperature is None else temperature,
            top_p=r.top_p,
            max_tokens=r.max_tokens,
            stop=tuple(r.stop),
            logprobs_topk=r.logprobs_topk,
        )
        return RolloutConfig(
            sampling=sampling,
            repeats=r.repeats if repeats is None else repeats,
            max_turns=cap_turns(max_turns, r.max_turns),
            mode=r.mode,
            seed=seed,
            progress=False,  # training prints one line per step and one bar per phase (vlrl.train.progress)
        )

    def collate(self, trajectories):
        return collate_trained(trajectories, self.spec)

    # ------------------------------------------------------------------ the trainer, on this rank's share

    def _share(self, batch) -> D.Share:
        if int((batch.image_counts == 0).sum()):
            # Every rank must run the vision tower in every micro-batch (FSDP all-gathers its blocks there).
            raise D.ShardingError(
                f"{int((batch.image_counts == 0).sum())} of {batch.size} trajectories have no "
                "image: a sharded run needs an image in every trajectory"
            )
        return D.share_of(batch.size, self.dist.rank, self.dist.world)

    def logprobs(self, batch, *, probe: bool = False, model=None):
        """The trainer's logprobs of the whole batch (``model``: default the policy), each rank computing its share."""
        if not self.dist.sharded:
            return self.trainer.logprobs(batch, model, probe=probe)
        share = self._share(batch)
        return D.gather_forward(self.trainer.logprobs(D.local_batch(batch, share), model, probe=probe), share, batch)

    def update(self, batch, inputs, *, seed: int) -> dict:
        """The RL update on the whole batch (``inputs`` from ``trainer.prepare`` on it), each rank its share."""
        if not self.dist.sharded:
            return self.trainer.rl_step(batch, inputs, seed=seed)
        share = self._share(batch)
        values = self.trainer.rl_step(D.local_batch(batch, share), D.local_rows(inputs, share), seed=seed)
        b = batch.to(self.trainer.device)  # the advantage statistics of the whole batch, not of a share
        return D.reduce_metrics(values) | advantage_stats(inputs.advantages, b.loss_mask, b.rewards.sum(-1), b.groups)

    def sft_update(self, sft_trainer: Trainer, batch) -> dict:
        if not self.dist.sharded:
            return sft_trainer.sft_step(batch)
        return D.reduce_metrics(sft_trainer.sft_step(D.local_batch(batch, self._share(batch))))

    # ------------------------------------------------------------------ checks

    def agreement(self, step: int, batch, old) -> dict:
        """Rollout vs trainer logprobs on this step's batch; logged, and fatal if run.agreement == 'stop'."""
        report = batch_agreement(batch, old, dtype=self.cfg.model.dtype)
        mask = batch.loss_mask.bool()
        row = self.log.agreement(step, report, (old.logprobs.cpu() - batch.rollout_logprobs)[mask])
        if report.breached and self.cfg.run.agreement == "stop":
            report.raise_if_breached()
        return row

    def engine_weights(self) -> dict[str, torch.Tensor] | None:
        """What the engine must hold: the policy's full weights (gathered from the shards under FSDP), with
        LoRA adapters merged in, under the base model's names, in the engine's dtype. Rank 0; None elsewhere
        (collective under FSDP: every rank calls it)."""
        full = full_weights(self.model, self.dist, self.dtype)
        if full is None or not self._lora:
            return full
        return merged_weights(full, self._lora, self.dtype)

    def sync_weights(self) -> None:
        """Push the trainer's weights to the engine, then verify the engine serves exactly them."""
        self.state.weight_version += 1
        weights = self.engine_weights()
        if weights is None:  # not rank 0
            return
        named = list(weights.items())
        self.engine.update_weights(named, version=self.state.weight_version)
        verify = getattr(self.engine, "verify_weights", None)
        if verify is not None:  # an inference server (vLLM): a logprob probe against the trainer's model
            tol = bounds_for(self.cfg.model.dtype).agreement.max_abs  # fp32 1e-4; bf16 0.5 (gross errors)
            try:
                delta = verify(self._verify_model(weights), tol)
            except Exception as exc:
                raise WeightSyncError(f"after sync {self.state.weight_version}: {exc}") from exc
            sync = self.engine.weights  # vlrl.vllm.weight_sync.WeightSync: how and how fast
            row = {"version": self.state.weight_version, "route": sync.last_route, "sync_s": sync.last_sync_s}
            self.log.append("weight_sync.jsonl", {**row, "probe_max_abs": delta, "probe_tol": tol})
            return
        want = weights_checksum(named)
        got = self.engine.weights_checksum()
        if got != want:
            raise WeightSyncError(
                f"after sync {self.state.weight_version} the engine's weights checksum is "
                f"{got[:12]}…, the trainer's {want[:12]}…"
            )

    def _verify_model(self, weights: dict[str, torch.Tensor]):
        if self._mirror is None:
            return self.model
        params = dict(self._mirror.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
        return self._mirror

    def probe_images(self, step: int, label: str) -> dict | None:
        """Image-sensitivity probe (``vlrl.checks.image_sensitivity``) on greedy episodes of the first
        eval rows, through the trainer's forward; logged to ``image_sensitivity.jsonl``. Under FSDP every
        rank runs the probe's forwards on the same episodes."""
        from vlrl.checks.image_sensitivity import image_sensitivity

        trajs = self.rollout(
            self.eval_rows[:4], seed=10_000_079, temperature=self.cfg.rollout.eval_temperature, repeats=1
        )
        batch = self.collate(trajs)
        if batch is None:
            return None
        row = {"step": step, "label": label, **image_sensitivity(self.model, batch.to(self.trainer.device)).row()}
        self.log.append("image_sensitivity.jsonl", row)
        return row

    # ------------------------------------------------------------------ evaluation and checkpoints

    def evaluate(self, step: int, label: str) -> float | None:
        """Mean return over the fixed eval rows at the eval temperature (greedy by default); rank 0 only
        (None elsewhere)."""
        trajs = self.rollout(
            self.eval_rows, seed=10_000_019, temperature=self.cfg.rollout.eval_temperature, repeats=1, shared=False
        )
        if trajs is None:
            return None
        mean = sum(t.total_reward for t in trajs) / max(1, len(trajs))
        success = sum(t.total_reward > 0 for t in trajs) / max(1, len(trajs))
        self.log.metrics(step, "eval", {"eval_reward_mean": mean, "eval_success": success, "label": label})
        if self.cfg.run.samples:
            write_jsonl(trajs[: self.cfg.run.samples], self.log.dir / "samples" / f"step_{step:06d}.jsonl")
        return mean

    def save(self, *, optimizer=None, log_sizes: dict[str, int] | None = None) -> Path:
        """Checkpoint now (atomically; every rank under FSDP). ``optimizer``: the SFT trainer's mid-SFT
        (default: the RL one). ``log_sizes``: where a resume from it trims the logs to (default: their sizes now)."""
        state = dataclasses.replace(
            self.state,
            optimizer="rl" if optimizer is None else "sft",
            log_sizes=self.log.sizes() if log_sizes is None else dict(log_sizes),
        )
        path = self.log.dir / "checkpoints" / checkpoint_name(state)
        return save_checkpoint(path, self.model, optimizer or self.trainer.optimizer, state)

    def resume(self, where: str) -> bool:
        """Restore a checkpoint (``latest``: the run dir's newest complete one) and trim the run's logs to
        it; False when ``latest`` finds none (the run starts fresh). A checkpoint of any rank count."""
        checkpoints = self.log.dir / "checkpoints"
        if self.dist.is_main and checkpoints.is_dir():
            remove_partial(checkpoints)
        D.barrier()
        path = latest_checkpoint(self.log.dir) if where == "latest" else Path(where)
        if path is None:
            return False
        self.state, restore = load_checkpoint(path, self.model)
        if restore is not None and self.state.optimizer == "rl":
            restore(self.trainer.optimizer)
        self.restore_sft_optimizer = restore if self.state.optimizer == "sft" else None
        D.barrier()  # every rank has read it before rank 0 removes newer checkpoints
        if path.resolve().parent == checkpoints.resolve():
            if self.dist.is_main:
                self._drop_newer_than(path)
            self.log.trim(self.state.log_sizes)  # what came after the checkpoint is redone, not repeated
        else:
            self.log.reset()  # resuming another run's checkpoint into a fresh directory
        version = self.state.weight_version
        self.state.weight_version = version - 1
        self.sync_weights()  # the engine serves the restored weights under the saved version
        return True

    def _drop_newer_than(self, path: Path) -> None:
        """Checkpoints after the one resumed from belong to the abandoned continuation: remove them."""
        mine = (self.state.rl_step, self.state.sft_step)
        for other in path.parent.iterdir():
            if other == path or not (other / "state.json").is_file():
                continue
            st = RunState.from_json((other / "state.json").read_text())
            if (st.rl_step, st.sft_step) > mine:
                shutil.rmtree(other)

    def close(self, finished: bool = False) -> None:
        """Close the log and the engine, leave the process group (``finished``: every rank reached the end)."""
        self.log.close()
        self._close_engine()
        if self.dist.sharded:  # the models first: FSDP's state holds the process group
            del self.model, self.trainer, self.engine, self._mirror, self._lora
            D.close_distributed(wait_for_peers=finished)
