"""Does a random-init policy learn a maze's first move from its first frame, trained as SFT trains it?

    python benchmarks/maze_reply_probe.py [--arch qwen2_5_vl] [--model tiny|small] [--init normal|fan_in]
        [--level 5x5] [--tile 25] [--steps 400] [--batch 32] [--lr 1e-3] [--every 50]
        [--open] [--start corner|random] [--image-stats model|maze] [--mazes 256]
        [--out benchmarks/results/maze_reply_probe_cpu.json]

The supervised probe of ``maze_perception.py`` reads its answers through four digit rows; this one trains what the
curriculum's SFT trains: the maze prompt (``maze_prompt``, keyword mode) with the first frame, and the expert's
reply ``<action>DIR</action><|im_end|>`` teacher-forced, cross-entropy over the whole vocabulary averaged over the
reply's tokens (token mean, as ``Trainer.sft_step``), AdamW, grad-norm clip 1. Every ``--every`` steps: the loss,
the direction token's cross-entropy (ln 4 = 1.386 is a uniform guess among the four moves) and held-out accuracy
(argmax over the vocabulary at the direction's position), and the vision tower's gradient norm. Mazes: seeds
0..255 for training (``--mazes``), 10**6.. for held-out (a 5x5 level has 16 distinct first frames). Appends the run
to ``--out``.

``--open``: the reply names the open directions first (``open: up left`` and a newline, the maze expert's
``expert_open``), teacher-forced with the rest. Then the teacher-forced direction is read with the true open list in
its context, so every run also reports ``heldout_greedy_move_acc``: each held-out reply decoded greedily (16 tokens
at most, the open list the model's own) and its last action parsed as the env does.

``--start random``: the training frames put the agent on a random floor tile of each maze (maze2d's ``start``), the
held-out ones stay at the corners (the numbers above); ``heldout_random_direction_acc`` is the teacher-forced
direction on 64 held-out mazes from random spots.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DIRECTION = 3
"""The direction's position in the reply's tokens: '<', 'action', '>', DIR, '</', 'action', '>', <|im_end|>."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen3_vl", "qwen2_vl"])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--init", default="normal", choices=["normal", "fan_in"])
    ap.add_argument("--level", default="5x5")
    ap.add_argument("--tile", type=int, default=25)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--mazes", type=int, default=256, help="training mazes (seeds 0..N-1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--open", action="store_true", help="the reply names the open directions first")
    ap.add_argument("--start", choices=["corner", "random"], default="corner", help="where the training frames start")
    ap.add_argument("--image-stats", choices=["model", "maze"], default="model", help="the processor's pixel stats")
    ap.add_argument("--out", default="benchmarks/results/maze_reply_probe_cpu.json")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch
    from maze_perception import probe_model_dir

    from vlrl.envs.maze_text import action_text

    from transformers import AutoModelForImageTextToText, AutoProcessor  # isort: skip (after vlrl's guard)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    path = probe_model_dir(args)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).train()
    processor = AutoProcessor.from_pretrained(path)

    processor.tokenizer.padding_side = "left"  # --open replies differ in length: every reply ends the row

    train, distinct, _ = encode_replies(processor, args, range(args.mazes), args.start)
    held, _, held_moves = encode_replies(processor, args, range(10**6, 10**6 + 64))
    spots, _, _ = encode_replies(processor, args, range(10**6, 10**6 + 64), "random")
    n_reply = len(processor.tokenizer.encode(action_text(0, "keyword") + "<|im_end|>", add_special_tokens=False))
    n_reply += int(max(enc["heads"].max() for enc in (train, held, spots)))  # the longest; shorter ones' rest masked
    per_img = train["pixel_values"].shape[0] // args.mazes
    vision = model.model.visual  # its gradient norm is logged
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    gen = torch.Generator().manual_seed(0)
    curve = []
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, args.mazes, (args.batch,), generator=gen)
        ce, _ = reply_ce(model, train, idx, n_reply, per_img)
        opt.zero_grad(set_to_none=True)
        (ce.sum() / reply_mask(train, idx, n_reply).sum()).backward()  # token mean over the replies' own tokens
        vgrad = torch.sqrt(sum(p.grad.pow(2).sum() for p in vision.parameters() if p.grad is not None))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0 or step == 1:
            with torch.no_grad():
                _, right = reply_ce(model, held, torch.arange(64), n_reply, per_img)
                _, right_spots = reply_ce(model, spots, torch.arange(64), n_reply, per_img)
                greedy = greedy_move_acc(model, processor, held, held_moves, per_img)
            point = {
                "step": step,
                "loss": round(float(ce.detach().sum() / reply_mask(train, idx, n_reply).sum()), 4),
                "direction_ce": round(float(ce.detach()[:, DIRECTION - 8].mean()), 4),
            }
            point |= {"heldout_direction_acc": round(float(right.float().mean()), 4), "vision_grad_norm": float(vgrad)}
            point |= {"heldout_greedy_move_acc": greedy}
            point |= {"heldout_random_direction_acc": round(float(right_spots.float().mean()), 4)}
            curve.append(point)
            print(json.dumps(point), flush=True)

    save_run(args, argv, {"distinct_train_frames": distinct, "final": curve[-1], "curve": curve}, t0)
    return 0


def reply_mask(enc: dict, idx, n_reply: int):
    """``[B, n_reply]``: 1 on each row's own reply tokens (its open list, if any, and the action's 8)."""
    import torch

    return (torch.arange(n_reply) >= n_reply - 8 - enc["heads"][idx, None]).float()


def reply_ce(model, enc: dict, idx, n_reply: int, per_img: int):
    """``[B, n_reply]`` cross-entropies of the last ``n_reply`` tokens, 0 before a shorter reply's start, and the
    ``[B]`` argmax at the direction being right."""
    import torch

    pixels = enc["pixel_values"].view(-1, per_img, enc["pixel_values"].shape[-1])[idx].flatten(0, 1)
    ids = enc["input_ids"][idx]
    out = model.model(
        input_ids=ids,
        attention_mask=enc["attention_mask"][idx],
        pixel_values=pixels,
        image_grid_thw=enc["image_grid_thw"][idx],
    )
    logits = out.last_hidden_state[:, -n_reply - 1 : -1] @ model.get_output_embeddings().weight.T
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, -n_reply:], reduction="none")
    ce = ce * reply_mask(enc, idx, n_reply)
    at = DIRECTION - 8  # the direction, counted from the end: the action's 8 tokens close every reply
    return ce, logits[:, at].argmax(-1) == ids[:, at]


def encode_replies(
    processor, args: argparse.Namespace, seeds: range, start: str = "corner"
) -> tuple[dict, int, list[int]]:
    """The mazes at ``seeds`` from ``start``: processor tensors of prompt, first frame and expert reply (left-padded;
    ``heads`` ``[B]``: each reply's open-list tokens, 0 without ``--open``), how many frames are distinct, the moves."""
    import torch
    from maze_perception import encode, make_data

    from vlrl.envs.maze_text import LEVELS, action_text, maze_prompt, open_text

    data = make_data(args.level, args.tile, seeds, start)
    size = LEVELS[args.level]["size"]
    heads = [open_text(m, (r, c)) if args.open else "" for m, r, c in zip(data["maps"], data["row"], data["col"])]
    replies = [h + action_text(m, "keyword") + "<|im_end|>" for h, m in zip(heads, data["move"], strict=True)]
    enc = encode(processor, data["frames"], maze_prompt(size, size, "keyword"), replies)
    enc["heads"] = torch.tensor([len(processor.tokenizer.encode(h, add_special_tokens=False)) for h in heads])
    return enc, len(set(f.tobytes() for f in data["frames"])), data["move"]


def save_run(args: argparse.Namespace, argv: list[str] | None, fields: dict, t0: float) -> None:
    """Append the run (its command, arguments, ``fields`` and wall time) to ``--out``."""
    from maze_perception import append_run

    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    run = {"command": f"python benchmarks/maze_reply_probe.py {argv_text}".strip(), **vars(args)}
    append_run(args.out, __doc__.strip().splitlines()[0], run | fields | {"wall_s": round(time.time() - t0, 1)})


def greedy_move_acc(model, processor, enc: dict, moves: list[int], per_img: int, max_new: int = 16) -> float:
    """The share of ``enc``'s rows whose greedy reply (the prompt alone, no cache: the tiny models' few tokens)
    ends in the expert's first move, parsed as the env parses it (its last ``<action>``)."""
    import torch

    from vlrl.envs.maze_text import parse_keyword_action

    lengths = (enc["input_ids"].shape[1] - enc["heads"] - 8).tolist()  # each row's prompt: left-padded, so cut
    rows = []
    for i, n in enumerate(lengths):  # a row at a time: the prompts end at different places once the replies go
        ids = enc["input_ids"][i : i + 1, :n]
        mask = enc["attention_mask"][i : i + 1, :n]
        pixels = enc["pixel_values"].view(-1, per_img, enc["pixel_values"].shape[-1])[i]
        new: list[int] = []
        for _ in range(max_new):
            out = model.model(
                input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=enc["image_grid_thw"][i : i + 1]
            )
            nxt = int((out.last_hidden_state[0, -1] @ model.get_output_embeddings().weight.T).argmax())
            if nxt == processor.tokenizer.convert_tokens_to_ids("<|im_end|>"):
                break
            new.append(nxt)
            ids, mask = (
                torch.cat([ids, torch.tensor([[nxt]])], 1),
                torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1),
            )
        rows.append(parse_keyword_action(processor.tokenizer.decode(new)).action == moves[i])
    return round(sum(rows) / len(rows), 4)


if __name__ == "__main__":
    raise SystemExit(main())
