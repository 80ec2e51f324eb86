"""``vlrl serve``: run a vLLM server for a checkpoint dir on loopback until interrupted."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="checkpoint directory (ours or a downloaded Qwen-VL one)")
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--log", default=None, help="server log file (default under the vlrl cache)")


def run(args: argparse.Namespace) -> int:
    import time

    from vlrl.engines.vllm_server import ServerConfig, VllmServer, vllm_available

    ok, why = vllm_available()
    if not ok:
        raise SystemExit(why)
    server = VllmServer(ServerConfig(args.model, port=args.port, max_model_len=args.max_model_len, log_path=args.log))
    with server:
        print(f"vLLM serving {args.model} at {server.url} (started in {server.start_seconds:.1f} s; log {server.log_path})",
              flush=True)
        try:
            while server.alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0 if server.proc is None else 1
