"""``vlrl tinker-serve``: serve a checkpoint directory over the Tinker API (loopback unless told otherwise).

The API key comes from ``--api-key-env`` (default ``TINKER_API_KEY``, the variable the SDK reads) or is
generated and printed once; clients set ``TINKER_BASE_URL`` to the printed URL. A bind address other than
loopback (``--host 0.0.0.0``, a LAN address, a host name) is refused unless ``--allow-remote`` is given and the key
comes from the environment: the server trains and samples for anyone holding the key, and a key printed to a
terminal is not one to expose to a network.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from vlrl.cli import count


def _scale(text: str) -> tuple[str, float]:
    group, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected GROUP=FACTOR (e.g. embed=0.1), got {text!r}")
    try:
        return group, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-model", required=True, help="checkpoint directory to train and sample")
    parser.add_argument("--model-name", help="the name clients pass as base_model (default: the directory name)")
    parser.add_argument("--engine", choices=("embedded", "vllm"), default="embedded", help="sampling engine")
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address (loopback by default; any other needs --allow-remote)"
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (needs the API key set in the --api-key-env variable)",
    )
    parser.add_argument("--port", type=count(0), default=8000)
    parser.add_argument(
        "--api-key-env",
        default="TINKER_API_KEY",
        help="environment variable holding the API key (tml-...); unset: a new key is printed",
    )
    parser.add_argument(
        "--lr-scale",
        type=_scale,
        action="append",
        default=[],
        metavar="GROUP=FACTOR",
        help="learning rate factor per module group (vision, merger, language, embed); repeatable",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-body-mb", type=count(1), default=256, help="request size limit")
    parser.add_argument("--max-samples", type=count(1), default=64, help="most num_samples per sample request")


def is_loopback(host: str) -> bool:
    """``host`` binds loopback only: ``localhost`` or a loopback IP (127.0.0.0/8, ::1). Other names are not
    resolved (a name may point anywhere): they count as remote."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, allow_remote: bool, key_configured: bool, key_env: str) -> None:
    """Refuse a non-loopback bind without ``--allow-remote`` and a key set in ``$key_env``, in one line."""
    from vlrl.errors import UsageError

    if is_loopback(host):
        return
    if not allow_remote:
        raise UsageError(
            f"--host {host!r} is not a loopback address: anyone who reaches it and holds the key can train and "
            "sample; pass --allow-remote to serve beyond this machine"
        )
    if not key_configured:
        raise UsageError(
            f"--host {host!r} --allow-remote needs an API key set in ${key_env} (tml-...), not one generated and "
            "printed"
        )


def run(args: argparse.Namespace) -> int:
    from vlrl.errors import UsageError
    from vlrl.tinker.server import build_service, new_api_key, serve_forever
    from vlrl.tinker.service import ServiceConfig

    check_bind(
        args.host,
        allow_remote=args.allow_remote,
        key_configured=bool(os.environ.get(args.api_key_env)),
        key_env=args.api_key_env,
    )
    path = Path(args.base_model)
    if not path.is_dir():
        raise FileNotFoundError(f"--base-model {args.base_model}: no such checkpoint directory")
    key = os.environ.get(args.api_key_env) or new_api_key()
    if not key.startswith("tml-"):
        raise UsageError(f"${args.api_key_env} must start with 'tml-' (the tinker SDK refuses other keys)")
    cfg = ServiceConfig(
        base_model=str(path),
        model_name=args.model_name or path.name,
        engine=args.engine,
        lr_scale=dict(args.lr_scale),
        max_samples=args.max_samples,
    )
    service = build_service(cfg, dtype=args.dtype)
    print(
        f"vlrl tinker-serve: {cfg.model_name} on http://{args.host}:{args.port} "
        f"(TINKER_BASE_URL=http://{args.host}:{args.port}"
        + ("" if os.environ.get(args.api_key_env) else f" TINKER_API_KEY={key}")
        + ")",
        flush=True,
    )
    serve_forever(service, host=args.host, port=args.port, api_key=key, max_body_bytes=args.max_body_mb << 20)
    return 0
