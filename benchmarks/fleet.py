"""Scoring fleet benchmark: throughput of 1, 2 and 4 ``relevancy-tracer worker`` processes on one
Redis Stream, queue latency, and an overload run with zero loss.

Everything on 127.0.0.1 in one run: ``redis-server`` (no persistence), the scripted
OpenAI-compatible server (``FakeOpenAIServer``: 100 ms per chat request, 10 ms per embeddings
request by default, standing in for a remote judge model), an OTLP receiver standing in for the
tracing backend (workers acknowledge a job only after its EVALUATOR span was exported there).

1. **Scaling.** For each fleet size: start the workers, wait until each has connected, put
   ``--jobs`` jobs on the stream at once, and time until every one is recorded done.
   Evaluations per second = jobs / that time; queue latency = the EVALUATOR spans'
   ``relevancy.queue.wait_ms`` (from the job being queued to its scoring starting), p50 / p99.
   The target is the ratio 4 workers / 1 worker >= 3x.
2. **Overload.** ``relevancy-tracer serve --queue`` (in process) in front of the largest fleet;
   OTLP/HTTP export requests of 10 spans offered at ``--overload-factor`` times the fleet's
   measured throughput for ``--overload-seconds``; a refused request (429) is re-sent after its
   ``Retry-After``, as the OTLP exporters and the Collector do. Then every span offered must be
   scored exactly once: lost = offered - done.

    python -m benchmarks.fleet                        # 1, 2, 4 workers; overload 10x for 60 s
    python -m benchmarks.fleet --overload-seconds 0   # scaling only

Needs ``redis-server`` (``make system-deps``) and the ``service`` extra (redis-py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent

from benchmarks._paths import relative  # noqa: E402

from relevancy_tracer.otel import attributes as A  # noqa: E402
from relevancy_tracer.otel.results import evaluation_id  # noqa: E402
from relevancy_tracer.service.jobs import ScoreRequest  # noqa: E402
from relevancy_tracer.service.queue import DONE_PREFIX, RedisStreamQueue  # noqa: E402
from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver, RedisServer  # noqa: E402

CLI = str(Path(sys.executable).parent / "relevancy-tracer")


def worker_env(model: FakeOpenAIServer, backend: OTLPReceiver, concurrency: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELEVANCY_TRACER_", "OTEL_"))}
    env.update(
        RELEVANCY_TRACER_LLM="openai",
        RELEVANCY_TRACER_LLM_BASE_URL=model.base_url,
        RELEVANCY_TRACER_LLM_MODEL="fake-chat",
        RELEVANCY_TRACER_EMBEDDINGS="openai",
        RELEVANCY_TRACER_EMBEDDING_MODEL="fake-embed",
        RELEVANCY_TRACER_EMBEDDING_BASE_URL=model.base_url,
        OPENAI_API_KEY="benchmark",
        RELEVANCY_TRACER_METHOD="ragas",
        RELEVANCY_TRACER_CONCURRENCY=str(concurrency),
        RELEVANCY_TRACER_QUEUE_SIZE="100000",
        OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint,
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_SERVICE_NAME="relevancy-tracer-worker",
    )
    return env


def start_fleet(n: int, redis_url: str, env: dict, logs: Path) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        log = (logs / f"worker{i}.log").open("w")
        procs.append(subprocess.Popen([CLI, "worker", "--queue", redis_url, "--claim-idle", "30"], env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    for i in range(n):  # each prints one line once it has connected and joined the group
        while "consuming" not in (logs / f"worker{i}.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    return procs


def stop_fleet(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def done_count(client: Any) -> int:
    return sum(1 for _ in client.scan_iter(DONE_PREFIX + "*", count=1000))


def scaling_run(n: int, jobs: int, redis_url: str, model: FakeOpenAIServer, backend: OTLPReceiver, concurrency: int, logs: Path) -> dict:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    queue = RedisStreamQueue(redis_url, max_length=jobs + 10)
    procs = start_fleet(n, redis_url, worker_env(model, backend, concurrency), logs)
    span_name = f"fleet-{n}"
    requests = []
    for i in range(jobs):
        trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
        requests.append(ScoreRequest(evaluation_id(trace_id, span_id, "ragas"), trace_id, span_id, span_name, "fleet-bench", f"Where is city number {i}?", f"City number {i} is in France.", "ragas"))
    try:
        t0 = time.perf_counter()
        for start in range(0, jobs, 500):
            assert queue.offer(requests[start : start + 500])
        while done_count(client) < jobs:
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    finally:  # a failed run must not leave workers behind
        stop_fleet(procs)
    spans = backend.wait_for_spans(lambda s: sum(1 for x in s if _run_of(x) == span_name) >= jobs, timeout=30)
    waits = np.asarray([s["attributes"][A.QUEUE_WAIT_MS] for s in spans if _run_of(s) == span_name], dtype=float)
    queue.close()
    client.close()
    return {
        "workers": n,
        "jobs": jobs,
        "seconds": round(elapsed, 3),
        "evaluations_per_second": round(jobs / elapsed, 2),
        "queue_wait_ms_p50": round(float(np.percentile(waits, 50)), 1) if len(waits) else None,
        "queue_wait_ms_p99": round(float(np.percentile(waits, 99)), 1) if len(waits) else None,
    }


def _run_of(span: dict) -> Optional[str]:
    return span["attributes"].get(A.EVALUATED_SPAN_NAME)


def export_request(spans: list[tuple[str, str, int]]) -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    def kv(k: str, v: str) -> Any:
        return common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))

    out = []
    for trace_id, span_id, i in spans:
        out.append(trace_pb2.Span(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id), name="overload", attributes=[kv("openinference.span.kind", "CHAIN"), kv("input.value", f"Where is city number {i}?"), kv("output.value", f"City number {i} is in France.")]))
    resource = resource_pb2.Resource(attributes=[kv("service.name", "overload-app")])
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(resource=resource, scope_spans=[trace_pb2.ScopeSpans(spans=out)])]).SerializeToString()


def overload_run(n: int, rate: float, seconds: float, redis_url: str, model: FakeOpenAIServer, backend: OTLPReceiver, concurrency: int, logs: Path, queue_bound: int) -> dict:
    """Offer ``rate`` spans/s for ``seconds`` to serve (in process, Redis queue bounded at
    ``queue_bound``) in front of ``n`` workers; re-send refused requests after Retry-After."""
    import redis

    from relevancy_tracer.config import Settings
    from relevancy_tracer.service import ScoringService

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    env = worker_env(model, backend, concurrency)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if k.startswith("OTEL_")})
    service = ScoringService(Settings.resolve(environ={}, method="ragas", queue_size=queue_bound), queue_url=redis_url, http_port=0, grpc_port=None).start()
    procs = start_fleet(n, redis_url, env, logs)
    try:
        url = f"http://127.0.0.1:{service.server.http_port}/v1/traces"
        offered: list[str] = []
        pending: list[tuple[float, bytes, int]] = []  # (not before, body, spans) of refused requests
        refusals = 0
        batch = 10
        t0 = time.perf_counter()
        sent_spans = 0
        counter = 0

        def post(body: bytes) -> tuple[bool, float]:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(req, timeout=30):
                    return True, 0.0
            except urllib.error.HTTPError as exc:
                if exc.code in (429, 503):
                    return False, float(exc.headers.get("Retry-After") or 1)
                raise

        while True:
            now = time.perf_counter() - t0
            if now < seconds:  # new spans due by now, in batches of 10
                while sent_spans < rate * now:
                    spans = []
                    for _ in range(batch):
                        trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
                        spans.append((trace_id, span_id, counter))
                        offered.append(evaluation_id(trace_id, span_id, "ragas"))
                        counter += 1
                    pending.append((0.0, export_request(spans), batch))
                    sent_spans += batch
            elif not pending:
                break
            due = [p for p in pending if p[0] <= now]
            pending = [p for p in pending if p[0] > now]
            for _, body, size in due:
                ok, retry_after = post(body)
                if not ok:
                    refusals += 1
                    pending.append((time.perf_counter() - t0 + retry_after, body, size))
            time.sleep(0.01)
        accepted_at = time.perf_counter() - t0
        while done_count(client) < len(offered) and time.perf_counter() - t0 < accepted_at + 3600:
            time.sleep(0.2)
        drained_at = time.perf_counter() - t0
        done = {key.decode()[len(DONE_PREFIX):] for key in client.scan_iter(DONE_PREFIX + "*", count=1000)}
    finally:  # a failed run must not leave workers or serve behind
        stop_fleet(procs)
        service.stop(10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        client.close()
    lost = len(set(offered) - done)
    return {
        "workers": n,
        "offered_spans_per_second": round(rate, 1),
        "offer_seconds": seconds,
        "offered": len(offered),
        "refused_requests": refusals,
        "all_accepted_after_s": round(accepted_at, 1),
        "drained_after_s": round(drained_at, 1),
        "scored": len(done & set(offered)),
        "lost": lost,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--jobs", type=int, default=600, help="jobs per scaling run")
    parser.add_argument("--concurrency", type=int, default=2, help="jobs each worker scores at once")
    parser.add_argument("--chat-delay", type=float, default=0.1)
    parser.add_argument("--embedding-delay", type=float, default=0.01)
    parser.add_argument("--overload-factor", type=float, default=10.0)
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--queue-bound", type=int, default=1000, help="the service's queue bound (jobs on the stream)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fleet.json")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as redis_server, FakeOpenAIServer(chat_delay=args.chat_delay, embedding_delay=args.embedding_delay) as model, OTLPReceiver(grpc=False) as backend:
        logs = Path(tmp)
        runs = []
        for n in sizes:
            run = scaling_run(n, args.jobs, redis_server.url, model, backend, args.concurrency, logs)
            runs.append(run)
            print(f"{n} worker(s): {run['evaluations_per_second']:.1f} evaluations/s, queue wait p50 {run['queue_wait_ms_p50']} ms, p99 {run['queue_wait_ms_p99']} ms", flush=True)
        ratio = runs[-1]["evaluations_per_second"] / runs[0]["evaluations_per_second"]
        print(f"{sizes[-1]} workers / {sizes[0]} worker: {ratio:.2f}x (target >= 3x)", flush=True)
        overload = None
        if args.overload_seconds > 0:
            rate = args.overload_factor * runs[-1]["evaluations_per_second"]
            overload = overload_run(sizes[-1], rate, args.overload_seconds, redis_server.url, model, backend, args.concurrency, logs, args.queue_bound)
            print(f"overload: {overload['offered']} spans offered at {overload['offered_spans_per_second']}/s for {args.overload_seconds:g} s, {overload['refused_requests']} requests refused and re-sent, {overload['scored']} scored, {overload['lost']} lost", flush=True)
    result = {
        "benchmark": "fleet",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "parameters": {k: relative(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "scaling": runs,
        "ratio_largest_to_smallest": round(ratio, 2),
        "overload": overload,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0 if ratio >= 3 and (overload is None or overload["lost"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
