"""vlrl's own ChatML chat template in the Qwen-VL format (``templates/chatml_vl.jinja``).

Turns render as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; each image part (``image`` or
``image_url``) renders as ``<|vision_start|><|image_pad|><|vision_end|>``, each video part with
``<|video_pad|>``; ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``; tools are listed in a
system turn and assistant ``tool_calls`` render as ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``.

Where it differs from the published Qwen2-VL / Qwen2.5-VL / Qwen3-VL templates, and why:

1. **No default system message.** The published Qwen2-VL and Qwen2.5-VL templates insert
   "You are a helpful assistant." when the conversation has none. The conversation is vlrl's
   source of truth, so nothing is rendered that it does not hold.
2. **One user turn per tool message.** The published templates merge consecutive ``tool`` messages
   into one ``user`` turn, so adding a second tool result rewrites the end of the first turn and the
   new render no longer extends the old one as a token prefix. Here each tool message is its own
   ``<|im_start|>user\\n<tool_response>\\n…\\n</tool_response><|im_end|>\\n`` turn.
3. **History is never edited.** Qwen3-VL's published template handles ``reasoning_content`` and may
   drop ``<think>`` blocks of earlier turns; ours renders every assistant turn verbatim, so each
   re-render is a prefix extension of the last one (multi-turn RL depends on it).
4. **No "Picture N:" labels** (the published ``add_vision_id`` option) and no video timestamps.
5. **Unknown roles and content-part types raise** instead of rendering nothing.
6. The tool-list preamble is worded like Qwen2.5's but is not byte-identical to any published one.
"""

from __future__ import annotations

from importlib import resources


def chat_template() -> str:
    """The template text (Jinja), as saved into checkpoints' tokenizer and processor."""
    return (resources.files("vlrl.models") / "templates" / "chatml_vl.jinja").read_text()
