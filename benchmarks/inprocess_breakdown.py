"""Where vlrl's in-process vLLM path (``vlrl.vllm.inprocess``) loses to raw offline ``LLM.chat``: one ``LLM`` with
vlrl's settings, the bench workload (224 px image + question, 128 new tokens, ``ignore_eos``, T = 1, seed i), timed
as five variants on fresh images each (a warm-up batch, then the best of ``--repeats``):

- ``chat``: ``LLM.chat`` as a plain user calls it (vLLM renders and processes the images itself);
- ``chat_vlrl_params``: the same with vlrl's per-request extras (the sampled token's logprob, the vision-token ban);
  ``chat_logprobs`` and ``chat_ban`` with one of the two each; ``chat_logprobs_raw`` the logprob alone, not
  detokenized (vlrl's generate asks ``detokenize=False``, which also leaves the logprob tokens undecoded);
- ``render``: the embedded renderer alone, all of a batch concurrently (its thread pool);
- ``generate``: vlrl's ``generate`` on prompts rendered beforehand (the engine alone);
- ``path``: the bench's vlrl path: render and ``agenerate`` per request, all concurrently (``path_timelines``: when
  the renders landed and the requests finished, per timed batch);
- ``agenerate``: ``agenerate`` per request on prompts rendered beforehand (the path without its renders);
- ``render_then_agenerate``: every render first, then ``agenerate`` per request (the path without the overlap);
- ``path_procs``: the path with each render in one of ``--render-workers`` processes (off this process's GIL);
- ``path_r2``: the path with a renderer of two threads;
- ``path_si``: the path with the interpreter's thread switch interval at 1 ms (5 ms by default) while it runs: how
  long a thread waiting for the GIL waits before it asks the holder to let go (C code holding it runs on).

Every variant's row carries ``engine``: how the driver thread spent the timed batch on vLLM's ``LLMEngine`` (steps,
seconds waiting for the engine core's outputs, processing them, adding requests) and the core's own pace read off
its outputs' timestamps (``core_step_ms``: between consecutive output batches; ``lag_ms``: an output's age when the
front end took it) — whether the engine core or the front end sets the time. Every row also carries ``cpu_s``:
the CPU seconds each of this process's threads (by name; threads that ended are not counted) and the engine core's
process spent over the timed batch.

    python3 benchmarks/inprocess_breakdown.py OUT.json [--execution graphs] [--sizes 64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best(run, batches, prepare=lambda b: b, trace=None) -> dict:
    """``run(prepare(batch))`` once as the warm-up, then timed on each later batch; the fastest kept (with its
    ``trace`` summary and ``cpu_s``: :func:`cpu_seconds` over it)."""
    run(prepare(batches[0]))
    times, tokens, engine, cpu = [], 0, [], []
    for batch in batches[1:]:
        ready = prepare(batch)
        if trace is not None:
            trace.summary()  # the warm-up's and the preparation's rows dropped
        before = cpu_seconds()
        t0 = time.perf_counter()
        tokens = run(ready)
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_delta(before, cpu_seconds()))
        engine.append(trace.summary() if trace is not None else {})
    k = times.index(min(times))
    s = times[k]
    row = {"seconds": round(s, 4), "tokens": tokens, "tok_per_s": round(tokens / s, 1), "all_seconds": times}
    row["cpu_s"] = cpu[k]
    return {**row, "engine": engine[k]} if trace is not None else row


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of each of this process's threads (``"<name> <tid>"``, a thread's name as
    Linux keeps it: an OpenMP team's threads carry their opener's) and of each child process (``"child <name>
    <pid>"``: vLLM's engine core). Which threads burn the cores beside the engine: a wide OpenMP team spins after
    each op it runs."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():  # Python's names onto Linux's, which new threads (OpenMP teams) inherit
        try:
            Path(f"/proc/self/task/{thread.native_id}/comm").write_text(thread.name[:15])
        except OSError:
            pass

    def read(path: str, label: str) -> None:
        try:
            text = Path(path).read_text()
        except OSError:  # ended meanwhile
            return
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        out[f"{label}{name} {Path(path).parent.name}"] = (int(fields[11]) + int(fields[12])) / tick

    for tid in os.listdir("/proc/self/task"):
        read(f"/proc/self/task/{tid}/stat", "")
        try:
            children = Path(f"/proc/self/task/{tid}/children").read_text().split()
        except OSError:
            children = []
        for pid in children:
            read(f"/proc/{pid}/stat", "child ")
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds spent between the two :func:`cpu_seconds`: ``threads`` (this process's, all), the 16 busiest
    threads and children by name and id, and ``threads_over_10ms`` (how many of this process's threads ran that long:
    a spinning OpenMP team shows as a block of equal ones)."""
    spent = {key: t - before.get(key, 0.0) for key, t in after.items()}
    mine = {k: v for k, v in spent.items() if not k.startswith("child ")}
    out = {"threads": round(sum(mine.values()), 2), "threads_over_10ms": sum(1 for v in mine.values() if v >= 0.01)}
    busiest = sorted(spent.items(), key=lambda kv: -kv[1])[:16]
    return {**out, **{k: round(v, 2) for k, v in busiest if v >= 0.01}}


_RENDERER = None  # a render process's own renderer (path_procs)


def _init_render(model_dir: str) -> None:
    global _RENDERER
    import torch

    from vlrl.render.embedded import EmbeddedRenderer

    torch.set_num_threads(1)  # one thread per process, as the thread pool's workers (run 6 ran 8 x 16: oversubscribed)

    _RENDERER = EmbeddedRenderer.from_pretrained(model_dir)


def _render(messages):
    assert _RENDERER is not None
    return _RENDERER.render(messages)


class EngineTrace:
    """Wraps the ``LLMEngine``'s ``add_request``, ``engine_core.get_output`` and ``output_processor.process_outputs``
    on the instance (a measurement only) and sums them per timed batch (:meth:`summary`, then reset)."""

    def __init__(self, llm_engine):
        self.rows: list[tuple[str, float, float, int, float]] = []  # kind, start, end, outputs, core timestamp
        for owner, name in (
            (llm_engine, "add_request"),
            (llm_engine.engine_core, "get_output"),
            (llm_engine.output_processor, "process_outputs"),
        ):
            setattr(owner, name, self._timed(name, getattr(owner, name)))

    def _timed(self, kind: str, fn):
        def timed(*args, **kwargs):
            t0 = time.monotonic()
            out = fn(*args, **kwargs)
            n, ts = (len(out.outputs), float(out.timestamp)) if kind == "get_output" else (0, 0.0)
            self.rows.append((kind, t0, time.monotonic(), n, ts))
            return out

        return timed

    def summary(self) -> dict:
        rows, self.rows = self.rows, []
        total = lambda kind: round(sum(e - s for k, s, e, _, _ in rows if k == kind), 3)  # noqa: E731
        gets = [r for r in rows if r[0] == "get_output" and r[3] > 0]
        stamps = [r[4] for r in gets]
        return {
            "steps": len(gets),
            "adds": sum(1 for r in rows if r[0] == "add_request"),
            "add_s": total("add_request"),
            "wait_core_s": total("get_output"),
            "process_s": total("process_outputs"),
            "core_span_s": round(stamps[-1] - stamps[0], 3) if stamps else None,
            "core_step_ms": quantiles([1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]) if len(stamps) > 1 else {},
            "lag_ms": quantiles([1e3 * (r[2] - r[4]) for r in gets]) if gets else {},
            "outputs_per_step": quantiles([float(r[3]) for r in gets]) if gets else {},
        }


def switched(interval: float, run):
    """``run()`` with ``sys.setswitchinterval(interval)``, the old interval back after."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        return run()
    finally:
        sys.setswitchinterval(old)


def quantiles(times: list[float]) -> dict:
    """First, quartiles and last of ``times`` (seconds)."""
    xs = sorted(times)
    return {
        q: round(xs[min(int(f * len(xs)), len(xs) - 1)], 3)
        for q, f in (("first", 0), ("q1", 0.25), ("median", 0.5), ("q3", 0.75), ("last", 1))
    }


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--execution", default="graphs")
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--variants",
        default="chat,chat_vlrl_params,render,generate,path",
        help="run in this order (also chat_logprobs, chat_logprobs_raw, chat_ban, agenerate, render_then_agenerate, "
        "path_procs, path_r2, path_si)",
    )
    parser.add_argument("--gather-cap", type=float, default=0.25, help="InprocessVllmEngine(gather_cap_s=)")
    parser.add_argument("--logprobs-from", choices=("vllm", "sampler"), default="vllm", help="InprocessVllmEngine's")
    parser.add_argument("--ban", choices=("processor", "bad_words"), default="processor", help="InprocessVllmEngine's")
    parser.add_argument("--render-workers", type=int, default=8, help="the embedded renderer's threads")
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (GIL hand-offs)")
    return parser.parse_args()


class Workload:
    """The variants (module docstring) over one in-process engine: ``table()`` maps a name to ``(run, prepare)``."""

    def __init__(self, args: argparse.Namespace, model_dir, engine, sampling):
        from vlrl.render.embedded import EmbeddedRenderer

        self.args, self.model_dir, self.engine, self.sampling = args, model_dir, engine, sampling
        workers = min(args.render_workers, os.cpu_count() or 1)
        self.renderer = EmbeddedRenderer.from_pretrained(model_dir, workers=workers)
        self.renderer2 = EmbeddedRenderer.from_pretrained(model_dir, workers=2) if "path_r2" in args.variants else None
        self.timelines: list[dict] = []  # per path batch: when renders landed and requests finished (s from start)
        self.procs: ProcessPoolExecutor | None = None  # path_procs: renders in processes of their own

    def params(self, i: int):
        return self.sampling(temperature=1.0, max_tokens=self.args.max_tokens, ignore_eos=True, seed=i)

    def chat(self, extras: dict):
        vllm_sampling = importlib.import_module("vllm").SamplingParams  # after vlrl's torchvision guard

        def run(batch) -> int:
            params = [
                vllm_sampling(temperature=1.0, max_tokens=self.args.max_tokens, ignore_eos=True, seed=i, **extras)
                for i in range(len(batch))
            ]
            llm = self.engine.llm
            outs = self.engine._driver.call(
                lambda: llm.chat(batch, sampling_params=params, use_tqdm=False), when_idle=True
            )
            return sum(len(o.outputs[0].token_ids) for o in outs)

        return run

    async def render_all(self, batch):
        return await asyncio.gather(*(self.renderer.arender(m) for m in batch))

    def generate(self, prompts) -> int:
        return sum(
            len(g.token_ids) for g in self.engine.generate(prompts, [self.params(i) for i in range(len(prompts))])
        )

    def in_procs(self, m):
        if self.procs is None:
            spawn = multiprocessing.get_context("spawn")
            self.procs = ProcessPoolExecutor(self.args.render_workers, spawn, _init_render, (str(self.model_dir),))
        return asyncio.get_running_loop().run_in_executor(self.procs, _render, m)

    async def path_all(self, batch, render=None) -> int:
        render = render or self.renderer.arender
        t0, rendered, done = time.perf_counter(), [], []

        async def one(i, m):
            prompt = await render(m)
            rendered.append(time.perf_counter() - t0)
            n = len((await self.engine.agenerate(prompt, self.params(i))).token_ids)
            done.append(time.perf_counter() - t0)
            return n

        n = sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))
        self.timelines.append({"rendered": quantiles(rendered), "finished": quantiles(done)})
        return n

    async def prerendered_all(self, prompts) -> int:  # agenerate per request on rendered prompts: the path - renders
        async def one(i, p):
            return len((await self.engine.agenerate(p, self.params(i))).token_ids)

        return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    def table(self) -> dict:
        from vlrl.vllm.config import BAN_KEY

        only_ban: dict = {"extra_args": {BAN_KEY: list(self.engine.banned_ids)}}
        if self.engine.ban == "bad_words":  # as the engine sends it (--ban bad_words)
            only_ban = {"bad_words": self.engine.ban_words()}
        ban = {"logprobs": 0, **only_ban}
        rendered = lambda b: asyncio.run(self.render_all(b))  # noqa: E731
        path = lambda render=None: lambda b: asyncio.run(self.path_all(b, render))  # noqa: E731
        second = self.renderer2.arender if self.renderer2 else None
        return {
            "chat": (self.chat({}), None),
            "chat_vlrl_params": (self.chat(ban), None),
            "chat_logprobs": (self.chat({"logprobs": 0}), None),
            "chat_logprobs_raw": (self.chat({"logprobs": 0, "detokenize": False}), None),
            "chat_ban": (self.chat(only_ban), None),
            "render": (lambda b: len(rendered(b)), None),
            "generate": (self.generate, rendered),
            "path": (path(), None),
            "path_procs": (path(self.in_procs), None),
            "path_r2": (path(second), None),
            "path_si": (lambda b: switched(0.001, lambda: path()(b)), None),
            "agenerate": (lambda p: asyncio.run(self.prerendered_all(p)), rendered),
            "render_then_agenerate": (lambda b: asyncio.run(self.prerendered_all(rendered(b))), None),
        }


def main() -> int:
    args = parse()
    from vlrl.bench.vllm_paths import fresh_batches  # vlrl first: its torchvision guard before vLLM's import
    from vlrl.engines.types import SamplingParams
    from vlrl.models.build import cached_model_dir
    from vlrl.vllm.config import ServerConfig
    from vlrl.vllm.inprocess import InprocessVllmEngine

    model_dir = cached_model_dir("qwen2_5_vl", os.environ.get("VLRL_BREAKDOWN_SIZE", "2b"))
    cfg = ServerConfig(
        str(model_dir),
        dtype=os.environ.get("VLRL_BREAKDOWN_DTYPE", "bfloat16"),
        max_images_per_prompt=1,
        kv_cache_gib=int(os.environ.get("VLRL_BREAKDOWN_KV_GIB", "16")),
        gpu_memory_utilization=0.3,
        execution=args.execution,
    )
    engine = InprocessVllmEngine(cfg, gather_cap_s=args.gather_cap, logprobs_from=args.logprobs_from, ban=args.ban)
    trace = EngineTrace(engine.llm.llm_engine)
    work = Workload(args, model_dir, engine, SamplingParams)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    result: dict = {"startup_seconds": round(engine.startup_seconds, 1), "execution": args.execution}
    result.update(logprobs_from=args.logprobs_from, ban=args.ban)
    from vlrl.vllm.capabilities import model_runner_v2

    result["model_runner_v2"] = model_runner_v2(engine.llm)
    result.update(gather_cap_s=args.gather_cap, render_workers=args.render_workers, switch_s=sys.getswitchinterval())
    result["threads_at_start"] = len(os.listdir("/proc/self/task"))
    table = work.table()
    names = args.variants.split(",")  # in the order asked
    for n in [int(x) for x in args.sizes.split(",")]:
        pool = fresh_batches(n, len(names) * (1 + args.repeats))
        for k, name in enumerate(names):
            run, prepare = table[name]
            batches = pool[k * (1 + args.repeats) : (k + 1) * (1 + args.repeats)]
            try:
                result.setdefault(name, {})[str(n)] = best(run, batches, prepare or (lambda b: b), trace)
            except Exception as exc:  # noqa: BLE001 — recorded, the next variant still runs
                result.setdefault(name, {})[str(n)] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            # a thread's first torch op opens an OpenMP team of its own (vlrl/openmp.py): a jump here is a new team
            result.setdefault(f"{name}_threads_after", {})[str(n)] = len(os.listdir("/proc/self/task"))
            if name.startswith("path"):
                result.setdefault(f"{name}_timelines", {})[str(n)] = work.timelines[1:]
                work.timelines.clear()
            Path(args.out).write_text(json.dumps(result, indent=1))
            print(name, n, result[name][str(n)], flush=True)
    engine.close()
    if work.procs is not None:
        work.procs.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
