"""``tinker-serve --engine vllm``: image chunks rendered by vLLM's renderer, sampler weights reaching the vLLM
server through vlrl's weight sync, and the sampled logprobs agreeing with the trainer's (marker ``vllm``)."""

from __future__ import annotations

import pytest
import torch
from tinker import types
from tinker_helpers import ARCH, image_conversation

from vlrl.checks.agreement import compare_logprobs
from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.tinker.client import append_tokens, conversation_input

pytestmark = pytest.mark.vllm
DESTRUCTIVE = True  # it reloads the shared server's weights (restored at the end): run last of its arch


def test_vllm_engine_trains_on_its_renders_and_samples_the_saved_weights(vllm_stack, renderer):
    import tinker

    from vlrl.models.load import load_model
    from vlrl.tinker.server import build_service, serve_in_thread
    from vlrl.tinker.service import ServiceConfig

    stack = vllm_stack(ARCH)
    service = build_service(
        ServiceConfig(base_model=str(stack.engine.model_dir), model_name="tiny", engine="vllm"), vllm=stack
    )
    running = serve_in_thread(service)
    client = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
    try:
        tc = client.create_lora_training_client(base_model="tiny", rank=0).result()
        model_input, rendered = conversation_input(image_conversation(11), renderer)
        answer = renderer.tokenizer("blue<|im_end|>")["input_ids"]
        full = list(rendered.token_ids) + answer
        weights = [0.0] * (len(rendered.token_ids) - 1) + [1.0] * len(answer)
        datum = types.Datum(
            model_input=append_tokens(model_input, answer[:-1]),
            loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
        )
        losses = []
        for _ in range(2):
            losses.append(tc.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert losses[1] < losses[0]
        sampler = tc.save_weights_and_get_sampling_client().result()
        seqs = sampler.sample(model_input, 2, types.SamplingParams(max_tokens=6, seed=0)).result().sequences
        model = service.models[tc.model_id].model
        base = load_model(service.cfg.base_model)
        for seq in seqs:
            rollout = torch.tensor(seq.logprobs)[None]
            with torch.no_grad():
                trainer = full_forward_logprobs(model, rendered, list(seq.tokens), 1.0)[None]
                on_base = full_forward_logprobs(base, rendered, list(seq.tokens), 1.0)[None]
            report = compare_logprobs(rollout, trainer, torch.ones_like(rollout))
            assert not report.breached and report.overall.max_abs < 1e-4, report.summary()
            assert (on_base - rollout).abs().max() > 1e-3, "vLLM sampled the base weights, not the saved ones"
    finally:
        client.close("success").result(timeout=30)  # ends its session's heartbeats before the server goes
        running.stop()  # the stack is the session's: a service given one leaves it running
        stack.engine.reload_checkpoint()  # the shared server back on the checkpoint for the tests after this one
