"""``vlrl generate``: render a conversation (JSON file or a text prompt) and generate from it.

The conversation is built and checked (images decoded by ``vlrl.messages``, with its limits) before
the model loads: a bad image or message fails in a second, not after loading a checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vlrl.cli import count, non_negative_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory (ours or a downloaded Qwen-VL one)")
    parser.add_argument("--messages", help="JSON file with an OpenAI-format message list")
    parser.add_argument("--prompt", help="a plain user prompt (instead of --messages)")
    parser.add_argument(
        "--image", action="append", default=[], help="PNG or JPEG file to attach to --prompt (repeatable)"
    )
    parser.add_argument("--max-tokens", type=count(1), default=32)
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy")
    parser.add_argument("--seed", type=count(0), default=0)
    parser.add_argument("--device", default="cpu")


def conversation(args: argparse.Namespace) -> list[dict]:
    """The messages to render, normalised and validated (every image decoded once)."""
    from vlrl.errors import BadInputError, UsageError
    from vlrl.messages import normalize_messages, text_part

    if args.messages and (args.prompt is not None or args.image):
        raise UsageError("give either --messages FILE or --prompt TEXT [--image F ...], not both")
    if args.messages:
        try:
            messages = json.loads(Path(args.messages).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BadInputError(f"--messages {args.messages}: not JSON ({exc})") from None
    elif args.prompt is not None:
        messages = [{"role": "user", "content": [*(_file_part(p) for p in args.image), text_part(args.prompt)]}]
    else:
        raise UsageError("give --messages FILE or --prompt TEXT")
    return normalize_messages(messages)


def _file_part(path: str) -> dict:
    """An image file as a data-URI part of its own bytes: decoded later by the one decoder, with its limits."""
    import base64

    from vlrl.errors import BadInputError
    from vlrl.messages import load_image

    raw = Path(path).read_bytes()
    mime = "image/jpeg" if raw[:3] == b"\xff\xd8\xff" else "image/png"
    part = {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"}}
    try:
        load_image(part)
    except BadInputError as exc:
        raise BadInputError(f"--image {path}: {exc.what}") from None
    return part


def run(args: argparse.Namespace) -> int:
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.render.embedded import EmbeddedRenderer

    if not Path(args.model).is_dir():
        raise FileNotFoundError(f"--model {args.model}: no such checkpoint directory")
    messages = conversation(args)
    prompt = EmbeddedRenderer.from_pretrained(args.model).render(messages)
    engine = EmbeddedEngine.from_pretrained(args.model, device=args.device)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    gen = engine.generate([prompt], params)[0]
    print(
        json.dumps(
            {
                "prompt_tokens": len(prompt),
                "placeholders": [p.__dict__ for p in prompt.placeholders],
                "token_ids": gen.token_ids,
                "logprobs": [round(x, 6) for x in gen.logprobs],
                "finish_reason": gen.finish_reason,
                "text": gen.text,
            }
        )
    )
    return 0
