"""A Tinker-compatible training service (``vlrl tinker-serve``) driven by the unmodified ``tinker`` SDK 0.38.

The SDK's calls (``create_lora_training_client``, ``forward_backward``, ``optim_step``,
``save_weights_for_sampler``, ``sample``, ...) land on vlrl's own pieces: the policy forward and module
groups of the trainer (``vlrl.train``), the renderer for image chunks (``vlrl.render.embedded``), the
embedded (or vLLM) engine for sampling, and peft LoRA (``vlrl.models.lora``). Modules:

- ``wire``: the protobuf bodies (``forward_backward`` in, ``ForwardBackwardOutput`` / ``SampleResponse`` out)
- ``inputs``: model-input chunks (text tokens, images with an expected token count) → rendered prompts
- ``losses``: cross_entropy, importance_sampling, ppo over the SDK's per-token inputs (a registry)
- ``training``: one trained model (full fine-tuning or LoRA) with forward_backward / optim_step
- ``sampling``: saved sampler weights and the engine that samples from them
- ``futures``: the future table (results outlive the request that made them; try_again polling)
- ``service`` / ``app``: the API's state and its HTTP routes (FastAPI)
- ``server``: a service for a checkpoint dir (embedded or vLLM engine) served by uvicorn; ``cli``: tinker-serve
- ``client``: for SDK users, a conversation → ``tinker.ModelInput`` of text and image chunks
"""
