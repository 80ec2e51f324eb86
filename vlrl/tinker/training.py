"""One trained model behind a Tinker training client: ``forward_backward`` accumulates gradients, ``optim_step``
applies them (AdamW with the request's hyperparameters), ``sampler_weights`` snapshots what a sampler serves.

The forward is the trainer's own (``vlrl.train.forward``): the decoder over the datum's ids and vision
tensors with explicit mRoPE positions, then contract logprobs (fp32 head, vision placeholder ids left
out, ``T = 1``) in chunks. Tinker's alignment: position ``i`` of the model input predicts
``target_tokens[i]``, so the hidden state at ``i`` scores ``target_tokens[i]`` (no shift here). A target
that is a vision placeholder id has no logprob (NaN in the output) and must carry weight 0.

Full fine-tuning, or LoRA adapters (``vlrl.models.lora``) when the client asked for a rank > 0. The
optimizer's parameter groups are the trainer's module groups (``vlrl.train.trainer.param_group``), each
at ``learning_rate × lr_scale[group]`` (the server's ``--lr-scale``; e.g. ``embed=0.1`` as
vlrl/recipes/color_square_rl.toml, whose header says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vlrl.errors import BadInputError
from vlrl.render.types import RenderedPrompt
from vlrl.tinker.losses import check_inputs
from vlrl.tinker.wire import ForwardBackwardCall
from vlrl.train.batch import Batch
from vlrl.train.forward import banned_ids, chunked_token_stats, decoder_hidden_states
from vlrl.train.trainer import clip_gradients, param_group

LORA_ALPHA = 32.0
"""LoRA alpha (Tinker fixes it too; the client chooses only the rank)."""
ATTN, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdamStep:
    """The SDK's ``AdamParams`` of one ``optim_step``."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        ok = (
            self.learning_rate >= 0
            and 0 <= self.beta1 < 1
            and 0 <= self.beta2 < 1
            and self.eps > 0
            and self.weight_decay >= 0
            and self.grad_clip_norm >= 0
        )
        if not ok:
            raise BadInputError(f"adam_params out of range: {self}")


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    seed: int = 0


@dataclass(frozen=True)
class StepResult:
    """Per datum ``{"logprobs": [N] float32}`` (NaN where undefined) and the call's metrics."""

    outputs: tuple[dict[str, np.ndarray], ...]
    metrics: dict[str, float]


class TrainedModel:
    """A policy model, its optimizer state, and its gradients accumulated since the last ``optim_step``."""

    def __init__(
        self,
        model,
        *,
        pad_id: int,
        lora: LoraSpec | None = None,
        lr_scale: Mapping[str, float] | None = None,
        micro_batch_size: int = 16,
    ):
        from vlrl.models.lora import apply_lora

        if lora is not None:
            targets = (ATTN if lora.train_attn else ()) + (MLP if lora.train_mlp else ())
            if not targets:
                raise BadInputError("LoRA needs train_attn or train_mlp")
            apply_lora(model, rank=lora.rank, alpha=LORA_ALPHA, targets=targets, seed=lora.seed)
        self.model, self.lora, self.pad_id = model, lora, pad_id
        self.lr_scale = dict(lr_scale or {})
        self.micro_batch_size = micro_batch_size
        self.steps = 0
        self._optimizer: torch.optim.AdamW | None = None

    # ------------------------------------------------------------------ forward / backward

    def forward_backward(self, call: ForwardBackwardCall, prompts: Sequence[RenderedPrompt]) -> StepResult:
        """Per-datum loss (a sum over tokens, ``vlrl.tinker.losses``), summed over the data; gradients
        accumulate unless ``call.forward_only``. Micro-batches of ``micro_batch_size`` data bound memory.

        Logprobs are computed where the loss can use them (a nonzero weight or advantage) — projecting
        every position onto the 151,936-token vocabulary would cost ~50x more on an RL batch, for outputs
        no loss reads; a forward-only call computes every position. Elsewhere the output is NaN."""
        specs = [check_inputs(call.loss_fn, d.inputs, call.loss_config, f"datum {i}") for i, d in enumerate(call.data)]
        inputs = [_tensors(d.inputs, len(p.token_ids), i) for i, (d, p) in enumerate(zip(call.data, prompts))]
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        wanted = [
            _checked_positions(x, call.forward_only, banned_ids(self.model), vocab, i) for i, x in enumerate(inputs)
        ]
        outputs: list[dict[str, np.ndarray]] = []
        total, metrics = 0.0, dict[str, float]()
        for start in range(0, len(prompts), self.micro_batch_size):  # all data checked: no half-applied gradients
            rows = range(start, min(start + self.micro_batch_size, len(prompts)))
            with torch.set_grad_enabled(not call.forward_only):
                targets = [inputs[i]["target_tokens"] for i in rows]
                logps = self._logprobs([prompts[i] for i in rows], targets, [wanted[i] for i in rows])
                loss = torch.zeros(())
                for i, lp in zip(rows, logps):
                    mask = ~torch.isnan(lp.detach())
                    datum_loss, m = specs[i].fn(torch.nan_to_num(lp), inputs[i], mask, call.loss_config)
                    loss = loss + datum_loss
                    for k, v in m.items():
                        metrics[f"{k}:sum"] = metrics.get(f"{k}:sum", 0.0) + v
                    outputs.append({"logprobs": lp.detach().float().numpy()})
            if not call.forward_only and loss.requires_grad:
                loss.backward()
            total += float(loss.detach())
        return StepResult(tuple(outputs), {"loss:sum": total} | metrics)

    def _logprobs(
        self, prompts: Sequence[RenderedPrompt], targets: Sequence[torch.Tensor], wanted: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Contract logprobs ``[N_b]`` of each row's targets where ``wanted`` (NaN elsewhere, and where the
        target is a vision id)."""
        model = self.model
        batch = prompt_batch(prompts, self.pad_id)
        hidden = decoder_hidden_states(model, batch)  # [B, L, H]
        banned = banned_ids(model)
        rows, cols, tgt = [], [], []
        for b, (t, w) in enumerate(zip(targets, wanted)):
            ok = w & ~torch.isin(t, banned)
            idx = ok.nonzero(as_tuple=True)[0]
            rows.append(torch.full_like(idx, b))
            cols.append(idx)
            tgt.append(t[idx])
        r, c = torch.cat(rows), torch.cat(cols)
        lp, _ = chunked_token_stats(
            model.get_output_embeddings(), hidden[r, c], torch.cat(tgt), 1.0, banned=banned, with_entropy=False
        )
        out, at = [], 0
        for b, t in enumerate(targets):
            n = len(cols[b])
            full = torch.full((len(t),), float("nan"), dtype=torch.float32)
            out.append(full.index_put((cols[b],), lp[at : at + n]))
            at += n
        return out

    # ------------------------------------------------------------------ optimizer

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """One AdamW step on the accumulated gradients (clipped to ``grad_clip_norm`` when > 0), then zero them."""
        opt = self._optimizer or self._make_optimizer()
        for group in opt.param_groups:
            group.update(
                lr=step.learning_rate * float(self.lr_scale.get(group["name"], 1.0)),
                betas=(step.beta1, step.beta2),
                eps=step.eps,
                weight_decay=step.weight_decay,
            )
        norm = clip_gradients(self.model, step.grad_clip_norm if step.grad_clip_norm > 0 else math.inf)["grad_norm"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": norm, "step": float(self.steps)}

    def _make_optimizer(self) -> torch.optim.AdamW:
        from vlrl.train.master import MasterAdamW  # bf16 weights step through fp32 masters (its docstring)

        unknown = set(self.lr_scale) - {"vision", "merger", "language", "embed"}
        if unknown:
            raise BadInputError(f"lr_scale has unknown module group(s) {sorted(unknown)}")
        groups: dict[str, list[torch.nn.Parameter]] = {}
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                groups.setdefault(param_group(name), []).append(p)
        self._optimizer = MasterAdamW([{"params": ps, "name": g} for g, ps in groups.items()], lr=0.0)
        return self._optimizer

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def sampler_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the weights a sampler serves, under the base model's names (LoRA merged in)."""
        from vlrl.models.lora import lora_layers, merged_weights

        named = {n: p.detach() for n, p in self.model.named_parameters()}
        if self.lora is not None:
            named = merged_weights(named, lora_layers(self.model))
        return {n: t.clone() for n, t in named.items()}


def _tensors(inputs: Mapping[str, np.ndarray], n: int, index: int) -> dict[str, torch.Tensor]:
    """The datum's loss inputs as ``[N]`` tensors (targets long, the rest fp32), each checked to be ``[N]``."""
    out = {}
    for name, arr in inputs.items():
        if arr.shape != (n,):
            raise BadInputError(
                f"datum {index}: loss_fn_inputs[{name!r}] has shape {list(arr.shape)}, but the "
                f"model input is {n} tokens (one value per position: [{n}])"
            )
        out[name] = torch.from_numpy(np.asarray(arr, dtype=np.int64 if name == "target_tokens" else np.float32))
    return out


def _checked_positions(
    inputs: Mapping[str, torch.Tensor], everywhere: bool, banned: torch.Tensor, vocab: int, index: int
) -> torch.Tensor:
    """``[N]`` bool: the positions whose logprob the loss can use (all of them for a forward-only call), after
    checking the targets are token ids and no weight or advantage sits on a vision-id target (it has no logprob:
    never sampled)."""
    t = inputs["target_tokens"]
    if len(t) and (int(t.min()) < 0 or int(t.max()) >= vocab):
        raise BadInputError(f"datum {index}: target_tokens outside the vocabulary [0, {vocab})")
    used = torch.zeros_like(t, dtype=torch.bool)
    vision = torch.isin(t, banned)
    for key in ("weights", "advantages"):
        if key in inputs:
            nonzero = inputs[key] != 0
            if bool((nonzero & vision).any()):
                pos = int((nonzero & vision).nonzero()[0, 0])
                raise BadInputError(
                    f"datum {index}: {key}[{pos}] is nonzero on a target that is a vision placeholder "
                    "id (no logprob: never sampled); give it 0"
                )
            used |= nonzero
    return torch.ones_like(used) if everywhere else used


def prompt_batch(prompts: Sequence[RenderedPrompt], pad_id: int) -> Batch:
    """A right-padded :class:`Batch` of ``prompts`` (ids, mask, vision tensors; nothing trained on)."""
    B, width = len(prompts), max(len(p.token_ids) for p in prompts)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p.token_ids)] = torch.tensor(p.token_ids, dtype=torch.long)
        attn[b, : len(p.token_ids)] = 1
    with_images = [p for p in prompts if p.n_images]
    zeros = torch.zeros((B, width), dtype=torch.float32)
    pixels = [p.pixel_values for p in with_images if p.pixel_values is not None]
    grids = [p.image_grid_thw for p in with_images if p.image_grid_thw is not None]
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=zeros,
        rewards=zeros,
        turn_index=torch.full((B, width), -1, dtype=torch.long),
        pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        image_counts=torch.tensor([p.n_images for p in prompts]),
        seq_lens=attn.sum(1),
        prompt_lens=attn.sum(1),
        groups=torch.arange(B),
        uids=tuple(str(b) for b in range(B)),
        temperature=1.0,
        rollout_logprobs=zeros,
    )
