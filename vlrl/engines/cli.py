"""``vlrl generate``: render a conversation (JSON file or a text prompt) and generate from it."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory (ours or a downloaded Qwen-VL one)")
    parser.add_argument("--messages", help="JSON file with an OpenAI-format message list")
    parser.add_argument("--prompt", help="a plain user prompt (instead of --messages)")
    parser.add_argument("--image", action="append", default=[], help="image file to attach to --prompt (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")


def run(args: argparse.Namespace) -> int:
    from PIL import Image

    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.messages import image_part, text_part
    from vlrl.render.embedded import EmbeddedRenderer

    if args.messages:
        with open(args.messages) as f:
            messages = json.load(f)
    elif args.prompt is not None:
        parts = [image_part(Image.open(p)) for p in args.image] + [text_part(args.prompt)]
        messages = [{"role": "user", "content": parts}]
    else:
        raise SystemExit("give --messages FILE or --prompt TEXT")
    prompt = EmbeddedRenderer.from_pretrained(args.model).render(messages)
    engine = EmbeddedEngine.from_pretrained(args.model, device=args.device)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    gen = engine.generate([prompt], params)[0]
    print(json.dumps({"prompt_tokens": len(prompt), "placeholders": [p.__dict__ for p in prompt.placeholders],
                      "token_ids": gen.token_ids, "logprobs": [round(x, 6) for x in gen.logprobs],
                      "finish_reason": gen.finish_reason, "text": gen.text}))
    return 0
