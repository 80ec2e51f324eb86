"""What vlrl believes each vLLM server holds of the images it sent (``vlrl.vllm.image_cache``), and the error a
0.26 server's fatal cache miss becomes. No vLLM needed: the 0.26 miss is injected by a fake server, because the
build CI runs (0.32) recovers from a miss and cannot produce it."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

import pytest

from vlrl.engines.types import SamplingParams
from vlrl.render.types import PlaceholderRange, RenderedPrompt
from vlrl.vllm.capabilities import REQUIRED_ROUTES
from vlrl.vllm.client import GENERATE
from vlrl.vllm.image_cache import ServerImages, item_bytes
from vlrl.vllm.renderer import VllmImageFeature
from vlrl.vllm.server import VllmServerError

URL = "http://a"


def _body(*images: tuple[str, int]) -> dict:
    """A generate body whose images are ``(mm_hash, payload bytes)``."""
    return {
        "features": {
            "mm_hashes": {"image": [h for h, _ in images]},
            "kwargs_data": {"image": ["A" * (n * 4 // 3) for _, n in images]},
            "mm_metadata": {"image": [None for _ in images]},
        }
    }


def test_images_held_stay_within_the_byte_budget_oldest_forgotten_first():
    images = ServerImages(capacity=100, capacity_bytes=3_000)
    images.record(URL, _body(("a", 1_200), ("b", 1_200)))
    assert images.held_bytes(URL) == 2_400
    slim = images.slim(URL, _body(("a", 1_200), ("b", 1_200)))
    assert slim["features"]["kwargs_data"]["image"] == [None, None]
    images.record(URL, _body(("c", 1_200)))  # 3,600 > 3,000: "a" (the oldest) goes
    assert images.held_bytes(URL) == 2_400
    slim = images.slim(URL, _body(("a", 1_200), ("c", 1_200)))
    assert slim["features"]["kwargs_data"]["image"][0] is not None  # sent whole: it may be gone from the server
    assert slim["features"]["kwargs_data"]["image"][1] is None
    images.record(URL, _body(("huge", 5_000)))  # larger than the budget alone: never named by hash
    assert images.slim(URL, _body(("huge", 5_000)))["features"]["kwargs_data"]["image"] != [None]
    assert images.held_bytes(URL) <= 3_000
    assert item_bytes("A" * 400) == 300


class _Dead026(http.server.BaseHTTPRequestHandler):
    """vLLM 0.26 after its engine core asserted on a cache miss: the generate answer ends in ``error``."""

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # the name BaseHTTPRequestHandler dispatches to
        paths = {r: {} for r in REQUIRED_ROUTES}
        self._answer({"version": "0.26.0"} if self.path == "/version" else {"paths": paths})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        if "features" not in body:  # the engine's vision-token ban probe (text only): a server that applies the ban
            banned = set(body["sampling_params"].get("extra_args", {}).get("vlrl_ban", []))
            top = [t for t in range(7, 40) if t not in banned][:20]  # its top 20, in 0.26's shape
            entry = {"token": f"token_id:{top[0]}", "logprob": -1.0}
            entry["top_logprobs"] = [{"token": f"token_id:{t}", "logprob": -1.0 - i / 10} for i, t in enumerate(top)]
            choice = {"index": 0, "token_ids": top[:1], "logprobs": {"content": [entry]}, "finish_reason": "length"}
            self._answer({"choices": [choice]})
            return
        choice = {"index": 0, "token_ids": [], "logprobs": {"content": []}, "finish_reason": "error"}
        self._answer({"choices": [choice]})

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _engine_on(handler, model_dir):
    """A ``VllmEngine`` on a local fake server answering with ``handler``; both closed on exit."""
    from vlrl.vllm.engine import VllmEngine

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = VllmEngine.from_pretrained(model_dir, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield engine
    finally:
        engine.close()
        server.shutdown()


def test_a_026_cache_miss_is_an_error_that_names_it(vlrl_model_dir):
    with _engine_on(_Dead026, vlrl_model_dir("qwen2_5_vl")) as engine:
        url = engine.client.urls[0]
        pad = engine.image_token_id
        feature = VllmImageFeature("AAAA", None, "h1")
        prompt = RenderedPrompt((1, pad, pad, 2), None, None, (PlaceholderRange(1, 2),), ("sha",), "", (feature,))
        sp = SamplingParams(max_tokens=4, seed=0)
        with pytest.raises(VllmServerError, match="finish_reason 'error'"):  # nothing named by hash: plain abort
            engine.generate([prompt], sp)
        engine.images.record(url, engine.request_body(prompt, sp))  # as if the server had been sent the image
        with pytest.raises(VllmServerError, match=rf"{GENERATE}: vLLM 0.26.0 lost an image this request named"):
            engine.generate([prompt], sp)


class _Mute(_Dead026):
    """A server whose every generate ends in ``error`` with no token, the ban probe's too."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer({"choices": [{"index": 0, "token_ids": [], "finish_reason": "error"}]})


def test_a_ban_probe_answered_without_a_token_is_an_error_that_names_it(vlrl_model_dir):
    with _engine_on(_Mute, vlrl_model_dir("qwen2_5_vl")) as engine:
        prompt = RenderedPrompt((1, 2, 3), None, None, (), (), "", ())
        with pytest.raises(VllmServerError, match=r"ban probe got no top 19 \(finish_reason 'error'\)"):
            engine.generate([prompt], SamplingParams(max_tokens=4, seed=0))
