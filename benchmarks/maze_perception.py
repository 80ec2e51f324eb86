"""A supervised perception probe: can a random-init Qwen-VL learn, from a maze's first frame alone, where
the agent is and which way the BFS expert moves first?

    python benchmarks/maze_perception.py [--arch qwen2_5_vl|qwen3_vl|qwen2_vl] [--model tiny|small] [--init fan_in]
        [--level 5x5] [--tile 0] [--train 256] [--heldout 64] [--steps 300] [--batch 32] [--lr 1e-3]
        [--vision-lr-scale 1] [--every 25] [--warmup 0] [--clip 0] [--target move|neighbours|walls|walls_move]
        [--say-position] [--out benchmarks/results/maze_perception_cpu.json] [--name RUN]

Per maze (seeds 0..train-1 for training, 10**6.. for held-out): the first frame (``env.gym_env.reset``),
the agent's tile (row, col of ``maze_map``), the goal tile, and the expert's first move (the first action
of ``shortest_path_actions``, as ``maze2d_expert`` plays it). The model sees the chat-templated prompt
(one image + a fixed question); the hidden states (after the final norm) at the LAST THREE prompt positions
are read out through the tied lm_head rows of the digit tokens: position -3 -> agent row over "0"..str(size-1),
-2 -> agent col over the same, -1 -> first move over "0".."3" (0 right, 1 up, 2 left, 3 down). The loss
is the sum of the three cross-entropies; AdamW over all weights (the vision tower's lr times
``--vision-lr-scale``). Every ``--every`` steps: train loss, held-out accuracies, chance (the train
majority class scored on held-out), the merged image tokens' RMS on held-out frames and the vision
tower's gradient norm. ``--warmup N``: linear lr warmup over N steps; ``--clip C``: clip the total grad
norm to C (0 = off; the logged ``grad_norm`` is before clipping). ``--target neighbours`` replaces the
move readout by 4 binary ones at the last 6 positions (row, col, then the tiles right/up/left/down of
the agent, each over "0" floor / "1" wall = ``maze_map[tile]``); ``--target walls`` by one binary readout
per corridor tile (the tiles whose wall state varies between mazes: 4 in 5x5, 12 in 7x7), at fixed absolute
positions in the frame, so perception of the walls is told apart from relating them to the agent;
``--target walls_move`` reads both the walls and, last, the first move (the walls as an auxiliary target).
``--say-position`` (``move`` or ``neighbours``) begins the reply with the agent's row and column digits,
teacher-forced, read out where the model predicts each, then the move at the column digit or the neighbours at
the words " right up left down" after it: does stating where the agent is make its surroundings readable?
``--tile 0`` = the arch's merge unit
(28 px Qwen2/2.5, 32 px Qwen3): one merged vision token per maze tile. Appends the run to ``--out``
(JSON, ``{"runs": [...]}``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NEIGHBOURS = ("right", "up", "left", "down")  # action order (maze2d.DELTAS)
QUESTION = "Where is the blue circle (row, column), and which way is the first move to the red square?"


def make_data(level: str, tile: int, seeds: range, start: str = "corner") -> dict:
    """Frames and labels of the mazes at ``seeds`` (the agent at a corner, or on a ``random`` floor tile)."""
    import numpy as np

    from vlrl.envs.maze2d import DELTAS
    from vlrl.envs.maze_solver import shortest_path_actions
    from vlrl.envs.maze_text import make_maze2d

    frames, row, col, move, goal = [], [], [], [], []
    nb: dict[str, list[int]] = {name: [] for name in NEIGHBOURS}
    maps = []
    for seed in seeds:
        env = make_maze2d(level, {"tile": tile, "start": start}, seed)
        frame, _ = env.gym_env.reset(seed=seed)
        game = env.gym_env.unwrapped
        frames.append(np.asarray(frame))
        row.append(game.agent[0])
        col.append(game.agent[1])
        goal.append(list(game.target))
        move.append(shortest_path_actions(game.maze_map, game.agent, game.target)[0])
        maps.append(np.asarray(game.maze_map))
        for a, name in enumerate(NEIGHBOURS):  # action a's neighbour: 1 = wall, 0 = floor
            nb[name].append(int(game.maze_map[game.agent[0] + DELTAS[a][0], game.agent[1] + DELTAS[a][1]]))
    return {"frames": frames, "row": row, "col": col, "move": move, "goal": goal, "maps": maps, **nb}


def probe_model_dir(args: argparse.Namespace):
    """The probes' random-init checkpoint (both probe scripts): vlrl's named ``tiny`` size, else
    :func:`vlrl.envs.maze_models.start_checkpoint`'s for ``args.model``, ``args.init`` and ``args.image_stats``."""
    if args.model == "tiny" and args.init == "normal" and args.image_stats == "model":
        from vlrl.models.build import cached_model_dir

        return cached_model_dir(args.arch, "tiny")
    from vlrl.envs.maze_models import start_checkpoint

    return start_checkpoint(args.arch, args.model, args.init, image_stats=args.image_stats)


def append_run(out: str | Path, what: str, run: dict) -> None:
    """Append ``run``, stamped with the repo's commit, to the results file ``out`` (``{"what", "runs": [...]}``; the
    maze probes' and ``maze_gap.py``'s files)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git where it runs (a device's copy of the tree): the caller records the commit
        commit = ""
    path = Path(out)
    data = json.loads(path.read_text()) if path.exists() else {"what": what, "runs": []}
    data["runs"].append(run | {"commit": commit})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def weights_config(level: str, weights: str, device: str, scratch: str):
    """The curriculum's ``level`` config on the model directory ``weights``, on ``device`` (``maze_gap.py`` and
    ``maze_errors.py`` evaluate a level's weights brought back from a device)."""
    import dataclasses

    from vlrl.envs.maze_curriculum import LevelPlan, level_config

    cfg = level_config(LevelPlan(level, 0, 0), scratch, weights)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, device=device))


def corridor_tiles(size: int) -> list[tuple[int, int]]:
    """The tiles whose wall state differs between mazes of one size: those joining two adjacent cells
    (odd row, even col or even row, odd col, inside the outer ring). Cells (odd, odd) are always floor,
    (even, even) tiles always wall."""
    inner = range(1, size - 1)
    return [(r, c) for r in inner for c in inner if (r + c) % 2 == 1]


def encode(processor, frames, question: str, tails: list[str] | None = None) -> dict:
    """Processor tensors for a batch of frames under one fixed prompt, each reply begun with its ``tails``
    entry when given (all frames one size; tails of different token lengths are padded on the tokenizer's
    ``padding_side``)."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    texts = [text + tail for tail in tails] if tails else [text] * len(frames)
    return processor(text=texts, images=list(frames), return_tensors="pt", padding=True)


def spoken_position(data: dict, target: str) -> list[str]:
    """The replies' teacher-forced start for ``--say-position``: the agent's row and column digits, then (for
    ``neighbours``) one word per neighbour, each read out at its own position."""
    words = " right up left down" if target == "neighbours" else ""
    return [f"{r}{c}{words}" for r, c in zip(data["row"], data["col"], strict=True)]


def vision_module(model):
    return model.model.visual


def parser() -> argparse.ArgumentParser:
    """The command line (the model, the mazes, the readout's target and the optimizer's settings)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl", "qwen2_vl"])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--init", default="normal", choices=["normal", "fan_in"], help="the weights' init scheme")
    ap.add_argument("--level", default="5x5")
    ap.add_argument("--tile", type=int, default=0, help="px per maze tile; 0 = the arch's merge unit")
    ap.add_argument("--train", type=int, default=256)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--vision-lr-scale", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=0, help="linear lr warmup steps")
    ap.add_argument("--clip", type=float, default=0.0, help="grad-norm clip; 0 = off")
    ap.add_argument("--target", default="move", choices=["move", "neighbours", "walls", "walls_move"])
    ap.add_argument(
        "--say-position", action="store_true", help="the reply starts with the agent's row, col (teacher-forced)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image-stats", choices=["model", "maze"], default="model", help="the processor's pixel stats")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/maze_perception_cpu.json")
    ap.add_argument("--name", default=None)
    return ap


def _label_keys(train: dict, held: dict, size: int, target: str) -> tuple[tuple[str, ...], dict[str, int]]:
    """The keys read out for ``target`` (row and col first) and each one's class count. Adds to ``train`` and
    ``held`` the corridor tiles' wall labels (``"w{r}{c}"``: 1 = wall at tile (r, c)), which ``walls`` reads."""
    tiles = corridor_tiles(size)
    for data in (train, held):
        data.update({f"w{r}{c}": [int(m[r, c]) for m in data["maps"]] for r, c in tiles})
    walls = tuple(f"w{r}{c}" for r, c in tiles)
    extra = {"move": ("move",), "neighbours": NEIGHBOURS, "walls": walls, "walls_move": (*walls, "move")}
    keys = ("row", "col", *extra[target])
    return keys, {**dict.fromkeys(keys, 2), "row": size, "col": size, "move": 4}


def _chance(train: dict, held: dict, ncls: dict[str, int], y_train: dict, y_held: dict, n_train: int) -> dict:
    """Chance: per key the train majority's held-out accuracy, ``loss`` (the train labels' summed entropy) and, per
    key after row and col, ``{key}_given_cell`` (the best guess knowing only the agent's tile: its train majority)."""
    import torch

    keys = tuple(y_train)
    chance = {}
    for k in keys:
        majority = int(torch.bincount(y_train[k], minlength=ncls[k]).argmax())
        chance[k] = round(float((y_held[k] == majority).float().mean()), 4)
    probs = {k: torch.bincount(y_train[k], minlength=ncls[k]).float() / n_train for k in keys}
    chance["loss"] = round(float(sum(-(p[p > 0] * p[p > 0].log()).sum() for p in probs.values())), 4)
    for k in keys[2:]:
        per_cell: dict = {}
        for r, c, v in zip(train["row"], train["col"], train[k], strict=True):
            per_cell.setdefault((r, c), []).append(v)
        best = {cell: max(set(vs), key=vs.count) for cell, vs in per_cell.items()}
        hits = [best.get((r, c)) == v for r, c, v in zip(held["row"], held["col"], held[k], strict=True)]
        chance[f"{k}_given_cell"] = round(sum(hits) / len(hits), 4)
    return chance


def _readout_at(n_keys: int, target: str, say: bool) -> list[int]:
    """Readout positions: the last ``n_keys``; with ``--say-position``, row and col where the model predicts the
    two digits (before each) and the rest at the tail's last positions, after the digits."""
    n_tail = 2 + (4 if target == "neighbours" else 0)
    return list(range(-n_keys, 0)) if not say else [-n_tail - 1, -n_tail, *range(-(n_keys - 2), 0)]


@dataclass(frozen=True)
class _Readout:
    """The probe's heads: the hidden states (after the final norm) at positions ``at``, one per key, through the
    tied lm_head rows of the ``digits`` tokens, key ``k`` over the first ``ncls[k]`` of them."""

    model: Any
    digits: list[int]
    at: list[int]
    keys: tuple[str, ...]
    ncls: dict[str, int]
    per_img: int  # patch rows per frame in the processor's pixel_values

    def batch(self, enc: dict, idx) -> dict:
        """The model inputs of frames ``idx`` ([B]) of the processor's tensors ``enc``."""
        pv = enc["pixel_values"].view(-1, self.per_img, enc["pixel_values"].shape[-1])[idx].flatten(0, 1)
        per_row = {k: v[idx] for k, v in enc.items() if k in ("input_ids", "attention_mask", "mm_token_type_ids")}
        return dict(per_row, pixel_values=pv, image_grid_thw=enc["image_grid_thw"][idx])

    def heads(self, inputs: dict) -> dict:
        """Each key's logits, [B, ncls[key]]."""
        hidden = self.model.model(**inputs).last_hidden_state[:, self.at]  # [B, K, H], after the final norm
        logits = hidden @ self.model.get_output_embeddings().weight[self.digits].T  # [B, K, size]
        return {k: logits[:, i, : self.ncls[k]] for i, k in enumerate(self.keys)}

    def loss(self, out: dict, y: dict):
        """The sum of the keys' cross-entropies (``y``: each key's labels, [B])."""
        import torch

        return sum(torch.nn.functional.cross_entropy(out[k], y[k]) for k in self.keys)


def _evaluate(readout: _Readout, enc_held: dict, y_held: dict, heldout: int) -> dict:
    """Held-out loss and accuracies, and the RMS of the held-out frames' merged image tokens (overall and between
    mazes), in eval mode; the model is left in train mode."""
    import torch

    model = readout.model
    model.eval()
    idx = torch.arange(heldout)
    with torch.no_grad():
        inputs = readout.batch(enc_held, idx)
        out = readout.heads(inputs)
        feats = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        feats = getattr(feats, "pooler_output", feats)
        feats = torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats
        toks = feats.view(heldout, -1, feats.shape[-1])
    model.train()
    acc = {k: round(float((out[k].argmax(-1) == y_held[k]).float().mean()), 4) for k in readout.keys}
    return {
        "heldout_loss": round(float(readout.loss(out, y_held)), 4),
        "acc": acc,
        "image_rms": round(float(toks.pow(2).mean().sqrt()), 5),
        "between_maze_rms": round(float(toks.std(0).pow(2).mean().sqrt()), 5),
    }


def _train(
    args: argparse.Namespace, readout: _Readout, enc_train: dict, y_train: dict, enc_held: dict, y_held: dict
) -> tuple[list[dict], int | None]:
    """AdamW (the vision tower's lr times ``--vision-lr-scale``) on random training batches, a curve point at step 1,
    every ``--every`` steps and the last; returns the curve and the step a ``KeyboardInterrupt`` stopped it at."""
    import torch

    model = readout.model
    visual = vision_module(model)
    vis_ids = {id(p) for p in visual.parameters()}
    groups = [
        {"params": [p for p in model.parameters() if id(p) not in vis_ids], "lr": args.lr},
        {"params": list(visual.parameters()), "lr": args.lr * args.vision_lr_scale},
    ]
    opt = torch.optim.AdamW(groups, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / args.warmup) if args.warmup else 1.0)
    gen = torch.Generator().manual_seed(args.seed)
    curve, losses = [], []
    stopped = None  # `timeout -s INT` ends training early but still records the run
    try:
        for step in range(1, args.steps + 1):
            idx = torch.randint(0, args.train, (args.batch,), generator=gen)
            loss = readout.loss(readout.heads(readout.batch(enc_train, idx)), {k: v[idx] for k, v in y_train.items()})
            opt.zero_grad(set_to_none=True)
            loss.backward()
            vgrad = torch.sqrt(sum(p.grad.pow(2).sum() for p in visual.parameters() if p.grad is not None))
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip if args.clip > 0 else float("inf"))
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if step % args.every == 0 or step == 1 or step == args.steps:
                point = {"step": step, "train_loss": round(sum(losses) / len(losses), 4), "lr": sched.get_last_lr()[0]}
                point.update(vision_grad_norm=float(vgrad), grad_norm=round(float(gnorm), 4))
                point.update(_evaluate(readout, enc_held, y_held, args.heldout))
                losses = []
                curve.append(point)
                print(json.dumps(point), flush=True)
    except KeyboardInterrupt:
        stopped = step
        print(f"interrupted at step {step}", flush=True)
    return curve, stopped


def _run_record(
    args: argparse.Namespace, argv: list[str] | None, tile: int, stop: int | None, data: dict, curve: list, wall: float
) -> dict:
    """The run as appended to ``--out`` (``stop``: the step an interrupt stopped it at; ``data``: the frames' and
    labels' numbers, in the record's order)."""
    return {
        "name": args.name or f"{args.arch}-{args.model}-vlr{args.vision_lr_scale:g}",
        "command": "python benchmarks/maze_perception.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "arch": args.arch,
        "model": args.model,
        "init": args.init,
        "level": args.level,
        "tile": tile,
        "steps": args.steps,
        "stopped_at_step": stop,
        "lr": args.lr,
        "vision_lr_scale": args.vision_lr_scale,
        "warmup": args.warmup,
        "clip": args.clip,
        "target": args.target,
        "say_position": args.say_position,
        "train_mazes": args.train,
        "heldout_mazes": args.heldout,
        **data,
        "final_acc": curve[-1]["acc"],
        "curve": curve,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.say_position and args.target not in ("move", "neighbours"):
        ap.error("--say-position goes with --target move or neighbours")

    import torch

    from vlrl.models.archs import patch_size  # vlrl first: its torchvision guard, before transformers' processors

    from transformers import AutoModelForImageTextToText, AutoProcessor  # isort: skip

    torch.set_num_threads(args.threads)
    t0 = time.time()
    tile = args.tile or 2 * patch_size(args.arch)
    path = probe_model_dir(args)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).train()
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    from vlrl.envs.maze_text import LEVELS

    size = LEVELS[args.level]["size"]  # agent row / col classes: the map's tile coordinates 0..size-1
    assert size <= 10, "one digit token per coordinate"
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(size)]
    assert len(set(digits)) == size, digits

    train = make_data(args.level, tile, range(args.train))
    held = make_data(args.level, tile, range(10**6, 10**6 + args.heldout))
    keys, ncls = _label_keys(train, held, size, args.target)
    y_train = {k: torch.tensor(train[k]) for k in keys}
    y_held = {k: torch.tensor(held[k]) for k in keys}
    chance = _chance(train, held, ncls, y_train, y_held, args.train)
    distinct = {f.tobytes() for f in train["frames"]}
    overlap = sum(f.tobytes() in distinct for f in held["frames"]) / len(held["frames"])
    say = args.say_position
    enc_train = encode(processor, train["frames"], QUESTION, spoken_position(train, args.target) if say else None)
    enc_held = encode(processor, held["frames"], QUESTION, spoken_position(held, args.target) if say else None)
    per_img = int(enc_train["pixel_values"].shape[0] // args.train)  # patch rows per frame
    print(
        f"{args.arch} {args.model} tile {tile} frame {train['frames'][0].shape} seq {enc_train['input_ids'].shape[1]} "
        f"grid {enc_train['image_grid_thw'][0].tolist()} distinct train frames {len(distinct)}, held-out frames "
        f"seen in train {overlap:.2f}, chance {chance}",
        flush=True,
    )

    readout = _Readout(model, digits, _readout_at(len(keys), args.target, say), keys, ncls, per_img)
    curve, stopped = _train(args, readout, enc_train, y_train, enc_held, y_held)
    data = {"distinct_train_frames": len(distinct), "heldout_frames_seen_in_train": round(overlap, 4), "chance": chance}
    run = _run_record(args, argv, tile, stopped, data, curve, round(time.time() - t0, 1))
    append_run(args.out, __doc__.strip().splitlines()[0], run)
    print(json.dumps({k: run[k] for k in ("name", "final_acc", "chance", "wall_s")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
