"""``vlrl serve``: run a vLLM server for a checkpoint dir on loopback until interrupted."""

from __future__ import annotations

import argparse
import os
from typing import get_args

from vlrl.vllm.config import Execution


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory (ours or a downloaded Qwen-VL one)")
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context in tokens (default: the model's max_position_embeddings)",
    )
    parser.add_argument(
        "--max-images-per-prompt",
        type=int,
        default=None,
        help="images per prompt (default: every image the context can hold)",
    )
    parser.add_argument(
        "--execution",
        default="auto",
        choices=get_args(Execution),
        help="how vLLM runs the model (auto: eager on CPU, decode as CUDA graphs on CUDA; compiled: vLLM's defaults)",
    )
    parser.add_argument(
        "--ban",
        default="processor",
        choices=("auto", "processor", "bad_words"),
        help="the vision-token ban: vlrl's logits processor loaded, or left out for vLLM's bad_words (auto: left out "
        "where vLLM then runs its model runner V2); an attached engine finds which (rollout.vllm_ban)",
    )
    parser.add_argument("--log", default=None, help="server log file (default under the vlrl cache)")


def run(args: argparse.Namespace) -> int:
    import time

    from vlrl.vllm.capabilities import vllm_available
    from vlrl.vllm.client import KEY_ENV
    from vlrl.vllm.server import ServerConfig, VllmServer, new_api_key

    ok, why = vllm_available()
    if not ok:
        raise SystemExit(why)
    key = os.environ.get(KEY_ENV) or new_api_key()
    server = VllmServer(
        ServerConfig(
            args.model,
            port=args.port,
            max_model_len=args.max_model_len,
            max_images_per_prompt=args.max_images_per_prompt,
            api_key=key,
            log_path=args.log,
            execution=args.execution,
            ban=args.ban,
        )
    )
    with server:
        cfg = server.config
        print(
            f"vLLM serving {args.model} at {server.url} (started in {server.start_seconds:.1f} s; "
            f"log {server.log_path}); max_model_len {cfg.max_model_len}, {cfg.max_images_per_prompt} images per prompt",
            flush=True,
        )
        if not os.environ.get(KEY_ENV):  # the user's own terminal: the only place the key is shown
            print(
                f"every route but /health and /version needs its API key; to attach:\n"
                f"  export VLRL_VLLM_URL={server.url} {KEY_ENV}={key}",
                flush=True,
            )
        try:
            while server.alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0 if server.proc is None else 1
