"""``vlrl bench``: one command that measures how fast vlrl runs over a built checkpoint, and writes JSON.

Sections (each a module here, each returning a JSON-ready dict): ``engines`` (embedded engine vs HF
``generate`` on the same requests at 1 / 8 / 64 / 256 sequences), ``vllm_paths`` (raw vLLM and vlrl's
vLLM path, skipped with the reason where vLLM cannot run), ``multiturn`` (per-turn rollout time vs the
number of earlier images, maze2d episodes), ``training`` (train tokens/s, MFU by the formula in
``flops``, peak memory, and the rollout-vs-trainer agreement of every engine measured). ``run`` ties
them together; ``cli`` is the subcommand. Light package: torch is imported inside the functions.
"""
