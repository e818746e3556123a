"""The scoring service: apps that never import this package, scored behind OTLP.

Real components on 127.0.0.1: the scripted OpenAI-compatible server, an OTLP receiver standing
in for the backend, redis-server for the fleet, Phoenix for annotations and backfills.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from relevancy_tracer.otel import attributes as A
from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver, RedisServer

from .conftest import ROOT, fake_model_env, openai_settings, subprocess_env

#: An app instrumented with the OpenTelemetry SDK only: it never imports relevancy_tracer.
#: argv: number of OpenInference traces, number of GenAI traces.
OTEL_ONLY_APP = textwrap.dedent(
    """
    import json, os, sys
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    assert "relevancy_tracer" not in sys.modules
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-only-app", "openinference.project.name": os.environ.get("PROJECT", "otel-only")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if os.environ.get("ALSO_EXPORT_TO"):  # a second backend (Phoenix), as a Collector fan-out would
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["ALSO_EXPORT_TO"] + "/v1/traces")))
    tracer = provider.get_tracer("app")
    ids = []
    for i in range(int(sys.argv[1])):
        with tracer.start_as_current_span("rag.answer") as span:
            span.set_attribute("openinference.span.kind", "CHAIN")
            span.set_attribute("input.value", f"Where is city number {i}?")
            span.set_attribute("output.value", f"City number {i} is in France.")
            with tracer.start_as_current_span("retrieve") as retriever:
                retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                retriever.set_attribute("retrieval.documents.0.document.content", f"City {i} lies in France.")
            ctx = span.get_span_context()
            ids.append(["openinference", format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")])
    for i in range(int(sys.argv[2])):
        with tracer.start_as_current_span("chat gpt-4o") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.input.messages", json.dumps([{"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}, {"role": "user", "parts": [{"type": "text", "content": f"What is the capital of country {i}?"}]}]))
            span.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"The capital of country {i} is Paris."}], "finish_reason": "stop"}]))
            ctx = span.get_span_context()
            ids.append(["genai", format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")])
    provider.shutdown()
    print(json.dumps(ids))
    """
)


def run_otel_only_app(endpoint: str, openinference: int, genai: int, also_export_to: str = "", project: str = "otel-only") -> list[list[str]]:
    env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", ALSO_EXPORT_TO=also_export_to, PROJECT=project)
    proc = subprocess.run([sys.executable, "-c", OTEL_ONLY_APP, str(openinference), str(genai)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def backend(monkeypatch):
    """An OTLP receiver standing in for the tracing backend; the service exports to it."""
    with OTLPReceiver(grpc=False) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "relevancy-tracer-service")
        yield receiver


def evaluator_spans(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["attributes"].get(A.OPENINFERENCE_SPAN_KIND) == A.SPAN_KIND_EVALUATOR]


def test_serve_scores_openinference_and_genai_spans_of_an_app_that_never_imports_it(server, backend):
    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, capture_content=True), http_port=0, grpc_port=None).start()
    try:
        ids = run_otel_only_app(f"http://127.0.0.1:{service.server.http_port}", openinference=3, genai=2)
        assert service.flush(30)
        spans = backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= 5, timeout=30)
        logs = backend.wait_for_logs(lambda records: len(records) >= 5, timeout=30)
    finally:
        service.stop(10)
    evaluations = evaluator_spans(spans)
    assert len(evaluations) == 5  # the retriever children are context, not candidates
    by_parent = {(s["trace_id"], s["parent_span_id"]): s for s in evaluations}
    for convention, trace_id, span_id in ids:
        span = by_parent[(trace_id, span_id)]  # in the scored span's trace, its child, linked to it
        assert span["links"][0]["span_id"] == span_id and span["resource"]["openinference.project.name"] == "otel-only"
        assert span["attributes"][A.STATUS] == "scored" and 0 <= span["attributes"][A.SCORE] <= 1
        assert len(span["attributes"][A.EVALUATION_ID]) == 32
    # GenAI: the question is the last user text part (the system prompt is not), the answer the assistant's text
    embedded = json.dumps([r["input"] for r in server.requests_to("embeddings")])
    generated_from = json.dumps([r["messages"] for r in server.requests_to("chat")])
    assert "What is the capital of country 1?" in embedded and "Be brief." not in embedded + generated_from
    assert "The capital of country 1 is Paris." in generated_from
    by_span = {(r["trace_id"], r["span_id"]) for r in logs if r["event_name"] == A.GEN_AI_EVALUATION_RESULT}
    assert {(t, s) for _, t, s in ids} == by_span  # the log-based event carries the scored span's context
    assert all(r["attributes"]["gen_ai.evaluation.name"] == "answer_relevancy" for r in logs)


def test_a_full_queue_refuses_with_retryable_codes_and_counts_it(server, backend):
    """HTTP 429 with Retry-After and gRPC UNAVAILABLE: exporters and Collectors re-send."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    from relevancy_tracer.service import ScoringService

    server.chat_delay = 5.0  # the one running evaluation holds its slot
    settings = openai_settings(server, queue_size=1, concurrency=1, llm_timeout=10.0)
    service = ScoringService(settings, http_port=0, grpc_port=0).start()

    def request(i: int) -> trace_service_pb2.ExportTraceServiceRequest:
        kv = lambda k, v: common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))  # noqa: E731
        span = trace_pb2.Span(trace_id=os.urandom(16), span_id=os.urandom(8), name="answer", attributes=[kv("openinference.span.kind", "CHAIN"), kv("input.value", f"q{i}?"), kv("output.value", f"a{i}.")])
        return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=[span])])])

    def post(i: int) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://127.0.0.1:{service.server.http_port}/v1/traces", data=request(i).SerializeToString(), headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(req, timeout=10) as reply:
                return reply.status, dict(reply.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)

    try:
        codes = [post(i)[0] for i in range(2)]  # one running, one queued
        server.wait_for_requests("chat", 1, timeout=10)
        status, headers = post(2)
        assert codes == [200, 200] and status == 429 and 1 <= int(headers["Retry-After"]) <= 30
        channel = grpc.insecure_channel(f"127.0.0.1:{service.server.grpc_port}")
        with pytest.raises(grpc.RpcError) as refused:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request(3), timeout=10)
        channel.close()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert service.refused == 2 and service.accepted == 2
        malformed = urllib.request.Request(f"http://127.0.0.1:{service.server.http_port}/v1/traces", data=b"not protobuf", headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(malformed, timeout=10)
        assert bad.value.code == 400  # not retryable: re-sending would not help
    finally:
        server.chat_delay = 0.0
        service.stop(15)


# ------------------------------------------------------------------------------ the Redis fleet


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server on a free port, stopped after the test."""
    with RedisServer(str(tmp_path)) as redis_server:
        yield redis_server.url


def start_worker(redis_url: str, model: FakeOpenAIServer, backend: OTLPReceiver, log: Path, claim_idle: float = 2.0, phoenix_url: str = "") -> subprocess.Popen:
    env = subprocess_env(
        fake_model_env(model),
        RELEVANCY_TRACER_PHOENIX_URL=phoenix_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint,
        OTEL_METRICS_EXPORTER="none",
        RELEVANCY_TRACER_METHOD="ragas",
        RELEVANCY_TRACER_CONCURRENCY="2",
    )
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "worker", "--queue", redis_url, "--claim-idle", str(claim_idle)]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)


def test_fleet_of_three_workers_loses_no_job_when_one_is_killed(server, backend, redis_url, phoenix, tmp_path):
    """serve --queue puts jobs on a Redis Stream; three worker processes consume it as one
    group; one is killed with SIGKILL mid-run; its taken jobs are reclaimed; every span is
    scored, recorded done, and carries exactly one annotation in Phoenix."""
    from relevancy_tracer.phoenix_annotations import ANNOTATION_NAME, PhoenixClient

    import redis

    from relevancy_tracer.service import ScoringService

    server.chat_delay = 0.1
    server.embedding_delay = 0.01
    service = ScoringService(openai_settings(server), queue_url=redis_url, http_port=0, grpc_port=None).start()
    workers = [start_worker(redis_url, server, backend, tmp_path / f"worker{i}.log", phoenix_url=phoenix.url) for i in range(3)]
    try:
        ids = run_otel_only_app(f"http://127.0.0.1:{service.server.http_port}", openinference=60, genai=0, also_export_to=phoenix.url)
        server.wait_for_requests("chat", 6, timeout=60)
        workers[0].kill()  # SIGKILL: its taken, unacknowledged jobs stay pending in the group
        workers[0].wait(10)
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 120
        while client.xlen("relevancy-tracer:evaluations") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.xlen("relevancy-tracer:evaluations") == 0, "jobs left on the stream"
        done = {k.decode().rsplit(":", 1)[1] for k in client.scan_iter("relevancy-tracer:done:*")}
        client.close()
    finally:
        for worker in workers[1:]:
            worker.send_signal(signal.SIGTERM)
        for worker in workers[1:]:
            assert worker.wait(30) == 0
        service.stop(10)
        server.chat_delay = server.embedding_delay = 0.0
    spans = backend.wait_for_spans(lambda s: {x["attributes"].get(A.EVALUATION_ID) for x in evaluator_spans(s)} >= done and len(done) == 60, timeout=30)
    scored = {(s["trace_id"], s["parent_span_id"]) for s in evaluator_spans(spans) if s["attributes"][A.STATUS] == "scored"}
    assert {(t, s) for _, t, s in ids} == scored and len(done) == 60
    outputs = [(tmp_path / f"worker{i}.log").read_text() for i in (1, 2)]
    summaries = [re.search(r"\((\d+) scored, (\d+) already done, (\d+) reclaimed, (\d+) failed, (\d+) retried, (\d+) dead-lettered\)", o) for o in outputs]
    assert all(summaries), outputs
    assert sum(int(m.group(3)) for m in summaries) >= 1, outputs  # the killed worker's jobs were reclaimed
    assert sum(int(m.group(4)) + int(m.group(6)) for m in summaries) == 0, outputs  # nothing failed, nothing dead-lettered
    phoenix.wait_for_spans("otel-only", lambda s: len(s) >= 60, timeout=60, name=["rag.answer"])
    client = PhoenixClient(phoenix.url)
    try:
        span_ids = [span_id for _, _, span_id in ids]
        deadline = time.monotonic() + 60
        while True:  # the annotations were accepted before the spans arrived: Phoenix applies them as they do
            annotations = []
            for start in range(0, 60, 20):
                page = client._request("GET", "/v1/projects/otel-only/span_annotations", params=[("span_ids", s) for s in span_ids[start : start + 20]] + [("limit", 1000)])
                annotations += [a["span_id"] for a in page["data"] if a["name"] == ANNOTATION_NAME]
            if sorted(annotations) == sorted(span_ids) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(annotations) == sorted(span_ids)  # exactly one each, even for reclaimed jobs
    finally:
        client.close()


def test_app_through_rotel_to_serve(server, backend, tmp_path):
    """The path that runs here: an OpenTelemetry-only app exports to rotel (collector-config/
    rotel.env, its exporter pointed at `serve`), rotel forwards to the scoring service, whose
    EVALUATOR spans reach the backend."""
    from relevancy_tracer.service import ScoringService

    from .test_collector import rotel_to_serve

    service = ScoringService(openai_settings(server), http_port=0, grpc_port=None).start()
    try:
        with rotel_to_serve(service.server.http_port, tmp_path) as rotel_port:
            ids = run_otel_only_app(f"http://127.0.0.1:{rotel_port}", openinference=4, genai=1)
            spans = backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= 5, timeout=60)
    finally:
        service.stop(10)
    scored = {(s["trace_id"], s["parent_span_id"]) for s in evaluator_spans(spans) if s["attributes"][A.STATUS] == "scored"}
    assert scored == {(t, s) for _, t, s in ids}
