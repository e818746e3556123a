"""Tracing overhead on the caller's thread: relevancy-tracer's decorator against a bare
OpenTelemetry span and three peers' decorators, plus RSS over a million sampled calls.

What is timed: one call of a traced function ``answer(question: str) -> str`` (it returns a
fixed 31-character answer), from just before the call to just after it returns, with
``time.perf_counter_ns`` (ns). Everything the tracing library does on the caller's thread is
inside that window; what its background threads do is not, except through the GIL.

Variants (``--variants``):

* ``bare-function``: the undecorated function (the timer's own cost plus the call).
* ``bare-span``: the function inside ``tracer.start_as_current_span`` of an SDK
  ``TracerProvider`` with ``SimpleSpanProcessor(InMemorySpanExporter())``, recording
  ``openinference.span.kind`` = CHAIN, ``input.value`` and ``output.value``.
* ``rt-unsampled``: ``@relevancy_tracer.trace`` with ``configure(sample_ratio=0.0)``: every
  call is counted ``not_sampled`` and its span ended at once.
* ``rt-sampled-closed``: sampled (``sample_ratio=1.0``, ``attach="answer_span"``), model
  endpoint a closed port on 127.0.0.1 (connection refused; the client retries 3 times).
* ``rt-sampled-closed-noretry``: the same with ``llm_max_retries=0``: every evaluation fails
  at once, so the worker drains the queue continuously and competes for the GIL.
* ``rt-sampled-hang``: sampled, model endpoint a :class:`FakeOpenAIServer` whose chat
  responder never answers (it waits until the benchmark ends).
* ``openinference-chain``: OpenInference's ``OITracer(provider.get_tracer(...)).chain``
  decorator over the bare span's provider setup.
* ``langfuse-observe``: Langfuse's ``@observe()``; Langfuse always adds its own
  ``LangfuseSpanProcessor`` (a ``BatchSpanProcessor``) to the provider it uses; it gets a fresh
  SDK ``TracerProvider`` and ``span_exporter=InMemorySpanExporter()`` (no OTLP exporter).
* ``traceloop-workflow``: OpenLLMetry's ``@workflow``: ``Traceloop.init(exporter=
  InMemorySpanExporter(), disable_batch=True, instruments=set(), telemetry_enabled=False)``:
  Traceloop creates and installs its own global provider with ``SimpleSpanProcessor`` around
  that exporter and its own ``on_start`` hook; no instrumentations, metrics or logs.

Each variant runs in its own child process, together with ``bare-function`` and ``bare-span``
(over their own provider setup), because Traceloop and Langfuse install span processors on the
provider they use and relevancy-tracer uses the global one: in a shared process one library's
processors would tax the others' spans. Inside a child the three variants alternate in blocks
(``--rounds`` x ``--block`` calls each, the order rotated every round) after a warm-up, so a
noisy neighbour slows them alike; ratios are taken against the bare span of the same child:
of the pooled medians (and p99s), and, less sensitive to drift, the median over rounds of the
ratio of the two block medians of the same round ("paired").
In-memory exporters are cleared between blocks, outside the timed calls.

Memory (``--memory-calls``, default 1,000,000): sampled calls against the endpoint that never
answers, spans to a counting exporter that keeps nothing (so the exporter itself holds no
memory); RSS (psutil, MiB) at 1%, 10%, 50% and 100% of the calls, with the worker's queue
depth and the number of spans already ended.

Usage::

    .venv-bench/bin/python -m benchmarks.overhead            # 200k timed calls per variant, 1M-call RSS run
    .venv-bench/bin/python -m benchmarks.overhead --quick    # 20k calls per variant, 100k-call RSS run

Writes benchmarks/results/overhead.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent

from benchmarks._paths import ROOT, relative  # noqa: E402

# No network exporters, no telemetry, no auto-instrumentation, for every library in the process.
for _key, _value in {
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "TRACELOOP_TELEMETRY": "false",
    "TRACELOOP_METRICS_ENABLED": "false",
    "TRACELOOP_LOGGING_ENABLED": "false",
    "LANGFUSE_MEDIA_UPLOAD_ENABLED": "false",
    "RELEVANCY_TRACER_SETUP_OTEL": "false",
}.items():
    os.environ[_key] = _value

QUESTION = "What is the capital of France?"
ANSWER = "Paris is the capital of France."

BASELINES = ("bare-function", "bare-span", "bare-span-rt-attributes")
VARIANTS = (
    "rt-unsampled",
    "rt-sampled-closed",
    "rt-sampled-closed-noretry",
    "rt-sampled-hang",
    "openinference-chain",
    "langfuse-observe",
    "traceloop-workflow",
)
PEERS = ("openinference-chain", "langfuse-observe", "traceloop-workflow")
#: The sampled variants the targets are about; rt-sampled-closed-noretry is reported for information
#: (a worker kept busy by evaluations failing at once).
TARGET_SAMPLED = ("rt-sampled-closed", "rt-sampled-hang")


def answer(question: str) -> str:
    """The traced application function: takes a question, returns an answer (no work)."""
    return ANSWER


# ------------------------------------------------------------------------------ setups


def _sdk_provider() -> tuple[Any, Any]:
    """The reference setup: SDK TracerProvider + SimpleSpanProcessor + InMemorySpanExporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def make_bare_span(provider: Any) -> Callable[[str], str]:
    tracer = provider.get_tracer("benchmark.bare_span")

    def bare_span(question: str) -> str:
        with tracer.start_as_current_span("answer", attributes={"openinference.span.kind": "CHAIN", "input.value": question}) as span:
            result = answer(question)
            span.set_attribute("output.value", result)
            return result

    return bare_span


def make_bare_span_rt_attributes(provider: Any) -> Callable[[str], str]:
    """The bare span recording the four attributes relevancy-tracer records on an unsampled call
    (span kind, input and output value, ``relevancy.status``): a reference that separates the
    cost of recording more data from the cost of the library's own logic."""
    tracer = provider.get_tracer("benchmark.bare_span_rt_attributes")

    def bare_span_rt_attributes(question: str) -> str:
        with tracer.start_as_current_span("answer", attributes={"openinference.span.kind": "CHAIN"}) as span:
            result = answer(question)
            span.set_attributes({"input.value": question, "output.value": result})
            span.set_attribute("relevancy.status", "not_sampled")
            return result

    return bare_span_rt_attributes


def closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class HangingEndpoint:
    """A FakeOpenAIServer whose chat replies never come (until :meth:`stop`)."""

    def __init__(self) -> None:
        from relevancy_tracer_testing import FakeOpenAIServer

        self._release = threading.Event()

        def hang(body: dict) -> str:
            self._release.wait()
            return "{}"

        self.server = FakeOpenAIServer(chat_responder=hang).start()
        self.base_url = self.server.base_url

    def stop(self) -> None:
        self._release.set()
        self.server.stop()


def setup_relevancy_tracer(variant: str, cleanups: list) -> tuple[Callable[[str], str], dict]:
    """Configure relevancy-tracer on the global reference provider; the decorated function."""
    import relevancy_tracer
    from opentelemetry import trace

    provider, exporter = _sdk_provider()
    trace.set_tracer_provider(provider)
    options: dict[str, Any] = {
        "llm": "openai",
        "embeddings": "openai",
        "llm_api_key": "benchmark-key",
        "setup_otel": False,
        "attach": "answer_span",
        "sample_ratio": 0.0 if variant == "rt-unsampled" else 1.0,
    }
    if variant == "rt-sampled-hang":
        endpoint = HangingEndpoint()
        cleanups.append(endpoint.stop)
        options["llm_base_url"] = endpoint.base_url
    else:
        options["llm_base_url"] = closed_port_url()
    if variant == "rt-sampled-closed-noretry":
        options["llm_max_retries"] = 0
    relevancy_tracer.configure(**options)
    cleanups.append(lambda: relevancy_tracer.shutdown(timeout=2.0))

    @relevancy_tracer.trace
    def traced(question: str) -> str:
        return answer(question)

    return traced, {"exporters": [exporter], "config": {k: v for k, v in options.items() if k != "llm_api_key"}}


def setup_openinference() -> tuple[Callable[[str], str], dict]:
    from openinference.instrumentation import OITracer, TraceConfig

    provider, exporter = _sdk_provider()
    tracer = OITracer(provider.get_tracer("benchmark.openinference"), config=TraceConfig())

    @tracer.chain
    def traced(question: str) -> str:
        return answer(question)

    return traced, {"exporters": [exporter], "config": "OITracer(SDK provider.get_tracer(), TraceConfig()) .chain; SimpleSpanProcessor(InMemorySpanExporter)"}


def setup_langfuse(cleanups: list) -> tuple[Callable[[str], str], dict]:
    from langfuse import Langfuse, observe
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    client = Langfuse(
        public_key="pk-lf-benchmark",
        secret_key="sk-lf-benchmark",
        base_url=closed_port_url().removesuffix("/v1"),  # nothing is sent: the exporter is ours
        tracer_provider=TracerProvider(),
        span_exporter=exporter,
    )
    cleanups.append(client.shutdown)

    @observe()
    def traced(question: str) -> str:
        return answer(question)

    return traced, {
        "exporters": [exporter],
        "config": "Langfuse(tracer_provider=TracerProvider(), span_exporter=InMemorySpanExporter(), base_url=closed port); "
        "its LangfuseSpanProcessor (BatchSpanProcessor) exports on a background thread; @observe() with default input/output capture",
    }


def setup_traceloop() -> tuple[Callable[[str], str], dict]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import workflow

    exporter = InMemorySpanExporter()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # Traceloop.init prints banners
        Traceloop.init(app_name="benchmark", exporter=exporter, disable_batch=True, telemetry_enabled=False, instruments=set())

    @workflow(name="answer")
    def traced(question: str) -> str:
        return answer(question)

    return traced, {
        "exporters": [exporter],
        "config": "Traceloop.init(exporter=InMemorySpanExporter(), disable_batch=True (SimpleSpanProcessor), instruments=set(), "
        "telemetry_enabled=False; TRACELOOP_METRICS_ENABLED=false, TRACELOOP_LOGGING_ENABLED=false); @workflow(name='answer')",
    }


def build(variant: str, cleanups: list) -> tuple[Callable[[str], str], dict]:
    if variant.startswith("rt-"):
        return setup_relevancy_tracer(variant, cleanups)
    if variant == "openinference-chain":
        return setup_openinference()
    if variant == "langfuse-observe":
        return setup_langfuse(cleanups)
    if variant == "traceloop-workflow":
        return setup_traceloop()
    raise ValueError(variant)


# ------------------------------------------------------------------------------ timing


def time_block(fn: Callable[[str], str], n: int, out: array) -> None:
    """Append ``n`` per-call durations (ns) of ``fn(QUESTION)`` to ``out``."""
    clock = time.perf_counter_ns
    q = QUESTION
    append = out.append
    for _ in range(n):
        start = clock()
        fn(q)
        append(clock() - start)


def stats(samples: array) -> dict:
    """Median, percentiles and mean of durations (ns)."""
    data = sorted(samples)
    n = len(data)

    def pct(p: float) -> int:
        return data[min(n - 1, int(p / 100.0 * n))]

    return {
        "calls": n,
        "median_ns": pct(50),
        "p90_ns": pct(90),
        "p99_ns": pct(99),
        "p99_9_ns": pct(99.9),
        "max_ns": data[-1],
        "mean_ns": sum(data) / n,
    }


def rt_counts() -> Optional[dict]:
    """relevancy-tracer's per-status call counts and queue depth (which path was timed)."""
    from relevancy_tracer.tracing import lifecycle

    current = lifecycle._current
    if current is None:
        return None
    counts: dict[str, int] = {}
    for (_, status, _, reason, _, _), value in current.metrics.counts().items():
        key = status + (f":{reason}" if reason else "")
        counts[key] = counts.get(key, 0) + value
    return {"statuses": counts, "queue_depth": current.jobs.depth}


def child_timing(variant: str, rounds: int, block: int, warmup: int, profile: Optional[str]) -> dict:
    """In a child process: time bare-function, bare-span and ``variant`` in alternating blocks."""
    cleanups: list = []
    span_provider, span_exporter = _sdk_provider()
    functions: dict[str, Callable[[str], str]] = {
        "bare-function": answer,
        "bare-span": make_bare_span(span_provider),
        "bare-span-rt-attributes": make_bare_span_rt_attributes(span_provider),
    }
    traced, info = build(variant, cleanups)
    functions[variant] = traced
    exporters = [span_exporter] + info["exporters"]
    try:
        assert traced(QUESTION) == ANSWER
        for name, fn in functions.items():
            time_block(fn, warmup, array("q"))
        if variant.startswith("rt-sampled"):
            time.sleep(0.5)  # let the worker reach its steady state (queue full, requests pending)
        for e in exporters:
            e.clear()
        samples = {name: array("q") for name in functions}
        block_medians: dict[str, list[int]] = {name: [] for name in functions}
        names = list(functions)
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                durations = array("q")
                if profiler is not None and name == variant:
                    profiler.enable()
                    time_block(functions[name], block, durations)
                    profiler.disable()
                else:
                    time_block(functions[name], block, durations)
                samples[name].extend(durations)
                block_medians[name].append(sorted(durations)[len(durations) // 2])
                for e in exporters:
                    e.clear()
        if profiler is not None:
            profiler.dump_stats(profile)
        exported_check = None
        if variant.startswith("rt-"):
            exported_check = rt_counts()
        paired = sorted(v / b for v, b in zip(block_medians[variant], block_medians["bare-span"]))
        return {
            "variant": variant,
            "config": info["config"],
            "stats": {name: stats(s) for name, s in samples.items()},
            # median over rounds of (variant block median / bare-span block median of the same round)
            "paired_median_ratio": paired[len(paired) // 2],
            "relevancy_tracer": exported_check,
        }
    finally:
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except Exception:
                pass


# ------------------------------------------------------------------------------ memory


def child_memory(calls: int) -> dict:
    """In a child process: ``calls`` sampled calls against an endpoint that never answers."""
    import gc

    import psutil
    import relevancy_tracer
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        """Counts exported (ended) spans and keeps none of them."""

        def __init__(self) -> None:
            self.count = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    endpoint = HangingEndpoint()
    settings = relevancy_tracer.configure(
        llm="openai", embeddings="openai", llm_api_key="benchmark-key", llm_base_url=endpoint.base_url, setup_otel=False, sample_ratio=1.0, attach="answer_span"
    )

    @relevancy_tracer.trace
    def traced(question: str) -> str:
        return answer(question)

    process = psutil.Process()
    checkpoints = sorted({max(1, calls // 100), max(1, calls // 10), max(1, calls // 2), calls})
    rows = []
    gc.collect()
    rss_before_warmup = process.memory_info().rss
    # Warm-up: the first evaluation imports and builds the model client in the worker (tens of
    # MiB, once per process); wait until its request reached the endpoint.
    traced(QUESTION)
    deadline = time.monotonic() + 60
    while not endpoint.server.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    gc.collect()
    rss_start = process.memory_info().rss
    started = time.perf_counter()
    done = 0
    try:
        for checkpoint in checkpoints:
            for _ in range(checkpoint - done):
                traced(QUESTION)
            done = checkpoint
            gc.collect()
            counts = rt_counts() or {}
            rows.append(
                {
                    "calls": done,
                    "rss_mib": process.memory_info().rss / 2**20,
                    "seconds": time.perf_counter() - started,
                    "queue_depth": counts.get("queue_depth"),
                    "spans_ended": exporter.count,
                    "spans_open": done - exporter.count,
                    "statuses": counts.get("statuses"),
                }
            )
    finally:
        relevancy_tracer.shutdown(timeout=2.0)
        endpoint.stop()
    return {
        "calls": calls,
        "rss_before_warmup_mib": rss_before_warmup / 2**20,
        "rss_start_mib": rss_start / 2**20,
        "warmup_requests_seen": len(endpoint.server.requests),
        "checkpoints": rows,
        "queue_size": settings.queue_size,
        "concurrency": settings.concurrency,
        "hold_timeout_s": settings.hold_timeout,
        "spans_ended_after_shutdown": exporter.count,
    }


# ------------------------------------------------------------------------------ parent


def run_child(arguments: list[str], timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    try:
        command = [sys.executable, "-m", "benchmarks.overhead", *arguments, "--child-out", path]
        completed = subprocess.run(command, cwd=ROOT, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"child {arguments} failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
        return json.loads(Path(path).read_text())
    finally:
        os.unlink(path)


def us(ns: float) -> str:
    return f"{ns / 1000:.2f}"


def timing_table(results: list[dict]) -> str:
    lines = [
        "| variant | median µs | p99 µs | p99.9 µs | bare span median / p99 µs (same process) | median / bare span | same, paired per round | p99 / bare span p99 | median / bare span with the same 4 attributes | bare function median µs |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        v, s, f = r["stats"][r["variant"]], r["stats"]["bare-span"], r["stats"]["bare-function"]
        s6 = r["stats"]["bare-span-rt-attributes"]
        lines.append(
            f"| {r['variant']} | {us(v['median_ns'])} | {us(v['p99_ns'])} | {us(v['p99_9_ns'])} | {us(s['median_ns'])} / {us(s['p99_ns'])} | "
            f"{r['median_ratio']:.2f}x | {r['paired_median_ratio']:.2f}x | {r['p99_ratio']:.2f}x | {v['median_ns'] / s6['median_ns']:.2f}x | {us(f['median_ns'])} |"
        )
    return "\n".join(lines)


def memory_table(memory: dict) -> str:
    lines = ["| sampled calls | RSS MiB | queue depth | spans ended | spans open | statuses so far | seconds |", "| ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for row in memory["checkpoints"]:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted((row["statuses"] or {}).items()))
        lines.append(f"| {row['calls']:,} | {row['rss_mib']:.1f} | {row['queue_depth']} | {row['spans_ended']:,} | {row['spans_open']:,} | {statuses} | {row['seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="alternating rounds per child (default 200)")
    parser.add_argument("--block", type=int, default=1000, help="calls per variant per round (default 1000)")
    parser.add_argument("--warmup", type=int, default=5000, help="unmeasured calls per variant before the rounds (default 5000)")
    parser.add_argument("--memory-calls", type=int, default=1_000_000, help="sampled calls in the RSS run (default 1,000,000; 0 skips it)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--profile-dir", type=Path, default=None, help="write a cProfile of each relevancy-tracer variant's timed calls here")
    parser.add_argument("--quick", action="store_true", help="20 rounds x 1000 calls, 2000 warm-up, 100,000-call RSS run")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "overhead.json", help="JSON results file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.block, args.warmup = 20, 1000, 2000
        args.memory_calls = min(args.memory_calls, 100_000)

    if args.child:
        if args.child == "memory":
            result = child_memory(args.memory_calls)
        else:
            profile = str(args.profile_dir / f"{args.child}.prof") if args.profile_dir and args.child.startswith("rt-") else None
            result = child_timing(args.child, args.rounds, args.block, args.warmup, profile)
        Path(args.child_out).write_text(json.dumps(result))
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}")
    if args.profile_dir:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    common = ["--rounds", str(args.rounds), "--block", str(args.block), "--warmup", str(args.warmup)]
    if args.profile_dir:
        common += ["--profile-dir", str(args.profile_dir)]
    timings = []
    for variant in variants:
        print(f"timing {variant} ...", file=sys.stderr, flush=True)
        result = run_child(["--child", variant, *common], timeout=3600)
        v, s = result["stats"][variant], result["stats"]["bare-span"]
        result["median_ratio"] = v["median_ns"] / s["median_ns"]
        result["p99_ratio"] = v["p99_ns"] / s["p99_ns"]
        timings.append(result)
    by_name = {r["variant"]: r for r in timings}

    targets: dict[str, Any] = {}
    if "rt-unsampled" in by_name:
        ratio = by_name["rt-unsampled"]["median_ratio"]
        targets["unsampled median within 1.1x bare span"] = {"ratio": ratio, "met": ratio <= 1.1}
    for name in TARGET_SAMPLED:
        if name in by_name:
            ratio = by_name[name]["p99_ratio"]
            targets[f"{name} p99 within 3x bare span p99"] = {"ratio": ratio, "met": ratio <= 3.0}
    peers = [p for p in PEERS if p in by_name]
    for ours in [v for v in by_name if v in ("rt-unsampled",) + TARGET_SAMPLED]:
        if peers:
            worst_median = max(by_name[ours]["median_ratio"] / by_name[p]["median_ratio"] for p in peers)
            worst_p99 = max(by_name[ours]["p99_ratio"] / by_name[p]["p99_ratio"] for p in peers)
            targets[f"{ours} below every peer (median, p99; relative to each process's bare span)"] = {
                "median_vs_fastest_peer": worst_median,
                "p99_vs_fastest_peer": worst_p99,
                "met": worst_median < 1.0 and worst_p99 < 1.0,
            }

    memory = None
    if args.memory_calls:
        print(f"memory: {args.memory_calls:,} sampled calls against an endpoint that never answers ...", file=sys.stderr, flush=True)
        memory = run_child(["--child", "memory", "--memory-calls", str(args.memory_calls)], timeout=3600)
        first, last = memory["checkpoints"][0], memory["checkpoints"][-1]
        growth = last["rss_mib"] - first["rss_mib"]
        memory["rss_growth_mib_first_to_last_checkpoint"] = growth
        targets["RSS flat over the sampled calls (growth first -> last checkpoint < 10 MiB)"] = {"growth_mib": growth, "met": growth < 10.0}

    print("## Per-call time on the caller's thread\n")
    print(timing_table(timings))
    print()
    for r in timings:
        if r.get("relevancy_tracer"):
            statuses = ", ".join(f"{k} {v:,}" for k, v in sorted(r["relevancy_tracer"]["statuses"].items()))
            print(f"- {r['variant']}: statuses of every call in that process: {statuses}; queue depth at the end {r['relevancy_tracer']['queue_depth']}")
    if memory is not None:
        print(f"\n## RSS over {memory['calls']:,} sampled calls (endpoint never answers; queue_size {memory['queue_size']}, "
              f"hold_timeout {memory['hold_timeout_s']:g} s; RSS {memory['rss_before_warmup_mib']:.1f} MiB before and "
              f"{memory['rss_start_mib']:.1f} MiB after the one-call warm-up that builds the model client)\n")
        print(memory_table(memory))
    print("\n## Targets\n")
    print("| target | figure | met |\n| --- | --- | --- |")
    for name, t in targets.items():
        figure = ", ".join(f"{k} {v:.2f}" for k, v in t.items() if k != "met")
        print(f"| {name} | {figure} | {'yes' if t['met'] else 'NO'} |")

    import importlib.metadata as md

    versions = {}
    for dist in ("relevancy-tracer", "opentelemetry-sdk", "traceloop-sdk", "langfuse", "openinference-instrumentation", "wrapt"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    payload = {
        "benchmark": "overhead",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "versions": versions,
        "parameters": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("child")},
        "timings": timings,
        "memory": memory,
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
