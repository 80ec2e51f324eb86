"""Conformance of ``vlrl tinker-serve`` at the HTTP level (the checklist of SkyRL's server tests): routes and
auth, request validation with one-line errors, size limits, future waiting (try_again, long poll, results
outliving the client), protobuf-only results, and idempotent training requests."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output
from tinker_helpers import MODEL_NAME

from vlrl.tinker.futures import Json

PROTO = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def http(tinker_server):
    with httpx.Client(base_url=tinker_server.url, headers={"X-API-Key": tinker_server.api_key}, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(http):
    session = http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    fut = http.post("/api/v1/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": MODEL_NAME})
    out = _result(http, fut.json()["request_id"])
    return out["model_id"]


def _result(http, request_id: str, accept: str = "application/json"):
    while True:
        r = http.post("/api/v1/retrieve_future", json={"request_id": request_id}, headers={"Accept": accept})
        if r.headers["content-type"].startswith("application/x-protobuf"):
            return r.content
        body = r.json()
        if body.get("type") != "try_again":
            return body


def _fwd_body(model_id: str, seq_id: int, n: int = 6) -> bytes:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(list(range(100, 100 + n))),
        loss_fn_inputs={"target_tokens": list(range(101, 101 + n)), "weights": [1.0] * n},
    )
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(req).SerializeToString()


def test_healthz_is_open_and_every_other_route_needs_the_key(tinker_server):
    with httpx.Client(base_url=tinker_server.url, timeout=10) as anon:
        assert anon.get("/api/v1/healthz").json() == {"status": "ok"}
        for method, route in [
            ("GET", "get_server_capabilities"),
            ("POST", "create_session"),
            ("POST", "retrieve_future"),
            ("POST", "forward_backward"),
            ("POST", "nope"),
        ]:
            assert anon.request(method, f"/api/v1/{route}").status_code == 401, route
        wrong = anon.get("/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-wrong"})
        assert wrong.status_code == 401 and "X-API-Key" in wrong.json()["detail"]


def test_capabilities_and_session_answer_in_the_sdks_types(http):
    caps = types.GetServerCapabilitiesResponse.model_validate(http.get("/api/v1/get_server_capabilities").json())
    assert [m.model_name for m in caps.supported_models] == [MODEL_NAME]
    session = types.CreateSessionResponse.model_validate(
        http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"}).json()
    )
    assert session.session_id
    assert types.ClientConfigResponse.model_validate(
        http.post("/api/v1/client/config", json={}).json()
    ).proto_compress_fwdbwd


@pytest.mark.parametrize(
    "route, body, status, words",
    [
        ("save_weights", {}, 400, "not supported"),
        ("load_weights", {}, 400, "create_training_client_from_state"),
        ("some/new/route", {}, 404, "not supported by vlrl tinker-serve"),
        ("create_model", {"session_id": "nope", "model_seq_id": 0, "base_model": MODEL_NAME}, 400, "session_id"),
        ("optim_step", {"model_id": "nope", "adam_params": {"learning_rate": 1e-3}}, 400, "unknown model_id"),
        (
            "create_sampling_session",
            {"session_id": "s", "sampling_session_seq_id": 0, "base_model": "other"},
            400,
            "not served here",
        ),
        (
            "create_sampling_session",
            {"session_id": "s", "sampling_session_seq_id": 0, "model_path": "tinker://x"},
            400,
            "no sampler weights",
        ),
        ("retrieve_future", {"request_id": "does-not-exist"}, 404, "does-not-exist"),
        ("create_model", {"session_id": "x", "base_model": MODEL_NAME}, 400, "session_id"),
    ],
)
def test_bad_or_unsupported_requests_get_one_line_errors(http, route, body, status, words):
    r = http.post(f"/api/v1/{route}", json=body)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert words in detail and "\n" not in detail


def test_unknown_ids_are_404_and_missing_fields_400(http):
    r = http.get("/api/v1/samplers/nope")
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    session = http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"}).json()["session_id"]
    r = http.post("/api/v1/create_model", json={"session_id": session, "base_model": MODEL_NAME})
    assert r.status_code == 400 and "model_seq_id" in r.json()["detail"]


def test_forward_backward_validation(http, model_id):
    r = http.post("/api/v1/forward_backward", json={"model_id": model_id})
    assert r.status_code == 400 and "x-protobuf" in r.json()["detail"]
    r = http.post("/api/v1/forward_backward", content=_fwd_body("nope", 1), headers=PROTO)
    assert r.status_code == 400 and "unknown model_id" in r.json()["detail"]
    msg = forward_backward_request_to_proto(
        types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(data=[], loss_fn="cross_entropy"),
            model_id=model_id,
            seq_id=1,
        )
    )
    msg.loss_fn = "dro"
    r = http.post("/api/v1/forward_backward", content=msg.SerializeToString(), headers=PROTO)
    assert r.status_code == 400 and "'dro' is not supported" in r.json()["detail"] and "ppo" in r.json()["detail"]


def test_sample_options_the_server_does_not_have_are_refused(http):
    body = {
        "base_model": MODEL_NAME,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 2},
        "num_samples": 1,
        "prompt_logprobs": True,
    }
    r = http.post("/api/v1/asample", json=body)
    assert r.status_code == 400 and "prompt_logprobs" in r.json()["detail"]
    r = http.post("/api/v1/asample", json={**body, "prompt_logprobs": False, "num_samples": 10_000})
    assert r.status_code == 400 and "num_samples" in r.json()["detail"]
    r = http.post("/api/v1/asample", json={**body, "prompt_logprobs": False, "sampling_params": {"top_p": 2.0}})
    assert r.status_code == 400 and "top_p" in r.json()["detail"]


def test_request_size_limits_hold_before_and_after_zstd(tinker_server, model_id):
    from vlrl.tinker.server import serve_in_thread

    small = serve_in_thread(tinker_server.service, max_body_bytes=4096)
    try:
        with httpx.Client(base_url=small.url, headers={"X-API-Key": small.api_key}, timeout=10) as c:
            r = c.post("/api/v1/forward_backward", content=b"x" * 5000, headers=PROTO)
            assert r.status_code == 413 and "limit" in r.json()["detail"]
            bomb = zstandard.ZstdCompressor().compress(b"\0" * 100_000)  # 100 kB from a few bytes
            assert len(bomb) < 4096
            r = c.post("/api/v1/forward_backward", content=bomb, headers={**PROTO, "Content-Encoding": "zstd"})
            assert r.status_code == 400 and "decompressed" in r.json()["detail"]
            ok = zstandard.ZstdCompressor().compress(_fwd_body(model_id, 0))
            r = c.post("/api/v1/forward_backward", content=ok, headers={**PROTO, "Content-Encoding": "zstd"})
            assert r.status_code == 200 and "request_id" in r.json()
    finally:
        small.stop(close_service=False)  # the session's server shares this service


def test_pending_futures_answer_try_again_after_a_long_poll_then_the_result(http, tinker_server):
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        fut = tinker_server.service.futures.submit(pool, lambda: (release.wait(30), Json({"answer": 42}))[1])
        r = http.post("/api/v1/retrieve_future", json={"request_id": fut["request_id"]})
        assert r.elapsed.total_seconds() >= 0.9 * tinker_server.service.cfg.long_poll_s  # it waited first
        assert r.json()["type"] == "try_again"
        release.set()
        assert _result(http, fut["request_id"]) == {"answer": 42}


def test_results_outlive_the_client_that_asked_and_are_protobuf_only(tinker_server, model_id):
    headers = {"X-API-Key": tinker_server.api_key, **PROTO}
    with httpx.Client(base_url=tinker_server.url, headers=headers) as first:  # submits, then disconnects
        rid = first.post("/api/v1/forward_backward", content=_fwd_body(model_id, 0)).json()["request_id"]
    with httpx.Client(base_url=tinker_server.url, headers={"X-API-Key": tinker_server.api_key}, timeout=30) as second:
        tinker_server.service.futures.wait(rid, 60)
        r = second.post("/api/v1/retrieve_future", json={"request_id": rid})  # no Accept: protobuf
        assert r.status_code == 406 and "x-protobuf" in r.json()["detail"]
        out = deserialize_forward_backward_output(_result(second, rid, accept="application/x-protobuf"))
    assert len(out.loss_fn_outputs) == 1 and out.loss_fn_outputs[0]["logprobs"].to_numpy().shape == (6,)
    assert np.isfinite(out.metrics["loss:sum"])


def test_training_requests_are_idempotent_by_model_and_seq_id(http, tinker_server, model_id):
    trained = tinker_server.service.models[model_id]
    first = http.post("/api/v1/forward_backward", content=_fwd_body(model_id, 77), headers=PROTO).json()
    again = http.post("/api/v1/forward_backward", content=_fwd_body(model_id, 77), headers=PROTO).json()
    assert first["request_id"] == again["request_id"]
    _result(http, first["request_id"], accept="application/x-protobuf")
    steps = trained.steps
    body = {"model_id": model_id, "seq_id": 78, "adam_params": {"learning_rate": 1e-4}}
    ids = {http.post("/api/v1/optim_step", json=body).json()["request_id"] for _ in range(3)}
    assert len(ids) == 1
    assert _result(http, ids.pop())["metrics"]["step"] == steps + 1
    assert trained.steps == steps + 1, "a retried optim_step must not step twice"
    other = http.post("/api/v1/optim_step", json={**body, "seq_id": 79}).json()["request_id"]
    _result(http, other)
    assert trained.steps == steps + 2


def test_the_sdks_close_finishes_its_session_and_no_model_joins_it_after(http, tinker_server):
    """``ServiceClient.close`` (SDK 0.38) posts ``/sessions/{id}/finish``; the session ends with its reason,
    a model asked for in it afterwards is refused by name, an unknown session is a 404."""
    import tinker

    service = tinker_server.service
    before = set(service.sessions)
    client = tinker.ServiceClient(base_url=tinker_server.url, api_key=tinker_server.api_key)
    client.create_sampling_client(base_model=MODEL_NAME)  # the client's first call opens its session
    (sid,) = set(service.sessions) - before
    client.close("success", detail="done").result(timeout=120)  # 30 s was missed once under two busy workers
    assert service.sessions[sid]["finished"] == {"reason": "success", "detail": "done"}
    r = http.post("/api/v1/create_model", json={"session_id": sid, "model_seq_id": 9, "base_model": MODEL_NAME})
    assert r.status_code == 400 and "finished" in r.json()["detail"], r.text
    r = http.post("/api/v1/sessions/session-nope/finish", json={"reason": {"type": "success"}})
    assert r.status_code == 404 and "session-nope" in r.json()["detail"], r.text
