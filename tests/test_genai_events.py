"""`serve` scores apps instrumented by OpenTelemetry's own GenAI instrumentation, whose content
travels as OTLP log events (issue 27).

The real instrumentation: a plain ``openai`` app instrumented by
``opentelemetry-instrumentation-openai-v2`` runs in a virtual environment of its own (built once
per module with the pins of :data:`APP_REQUIREMENTS`; the versions it shares with this project's
venv are constrained to this venv's, so pip takes them from its cache), calls the scripted
OpenAI-compatible server, and exports traces and logs over OTLP/HTTP to an in-process
:class:`~relevancy_tracer.service.ScoringService`, whose EVALUATOR spans go to an
:class:`~relevancy_tracer_testing.OTLPReceiver`. Raw OTLP requests (protobuf, JSON, gRPC) cover
the join's orderings, expiry and bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from importlib import metadata
from typing import Any, Optional

import pytest

from relevancy_tracer.otel import attributes as A
from relevancy_tracer.service.join import CONTENT_NOT_CAPTURED, CONTENT_WITHOUT_SPAN, EVICTED, SPAN_WITHOUT_CONTENT, TOOL_CALL, ContentJoin, Held, content_of
from relevancy_tracer.service.otlp import ReceivedLog
from relevancy_tracer_testing import FakeOpenAIServer, Raw

from .conftest import ROOT, openai_settings, subprocess_env
from .test_service import backend, evaluator_spans as evaluations  # noqa: F401 - backend is a fixture
from .test_service_faults import no_exports  # noqa: F401 - a fixture

#: The instrumentation and its GenAI utilities, pinned to a pair that installs with this
#: project's OpenTelemetry and wrapt 2: opentelemetry-instrumentation-openai-v2 2.4b0 fails to
#: import opentelemetry.util.genai.instruments with opentelemetry-util-genai 1.2b0 and 1.3b0,
#: ignores the default (events) mode with 1.0b0 and 1.1b0; 2.3b0 needs wrapt < 2.
APP_REQUIREMENTS = ["opentelemetry-instrumentation-openai-v2==2.4b0", "opentelemetry-util-genai==0.4b0"]
#: Packages the app shares with this venv, installed at this venv's versions.
SHARED = ["openai", "httpx", "wrapt", "protobuf", "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-common", "opentelemetry-proto", "opentelemetry-instrumentation", "opentelemetry-semantic-conventions"]

#: A plain openai app with OpenTelemetry's official instrumentation; it never imports
#: relevancy_tracer. argv: base URL of the model server, then one question per call
#: (a question starting with "tool:" asks for a tool). Prints the chat spans' ids as JSON.
GENAI_APP = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import _logs, trace
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "genai-app"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    _logs.set_logger_provider(logger_provider)

    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    OpenAIInstrumentor().instrument()
    import openai

    assert "relevancy_tracer" not in sys.modules
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
    calls = []
    for question in sys.argv[2:]:
        tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}] if question.startswith("tool:") else None
        with trace.get_tracer("genai-app").start_as_current_span("handle") as parent:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}], **({"tools": tools} if tools else {}))
        calls.append(format(parent.get_span_context().trace_id, "032x"))
    tracer_provider.shutdown()
    logger_provider.shutdown()
    print(json.dumps(calls))
    """
)

QUESTIONS = ["Where is Lyon?", "What is the capital of Italy?", "How tall is Mont Blanc?"]
ANSWERS = ["Lyon is in France, on the Rhone.", "Rome is the capital of Italy.", "Mont Blanc is 4806 metres tall."]


@pytest.fixture(scope="module")
def app_python(tmp_path_factory) -> str:
    """The python of a fresh venv holding the instrumented app's packages."""
    base = tmp_path_factory.mktemp("genai-app")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    constraints = base / "constraints.txt"
    constraints.write_text("".join(f"{name}=={metadata.version(name)}\n" for name in SHARED))
    python = str(venv / "bin" / "python")
    proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(constraints), *APP_REQUIREMENTS, "openai", "httpx", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"], capture_output=True, text=True, timeout=900, env=subprocess_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    return python


def run_app(python: str, endpoint: str, model: FakeOpenAIServer, questions: list[str], **env: str) -> list[str]:
    """Run the instrumented app; returns the trace id of each call."""
    environment = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRICS_EXPORTER="none", **env)
    environment.pop("PYTHONPATH", None)
    environment.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([python, "-c", GENAI_APP, model.base_url, *questions], env=environment, capture_output=True, text=True, timeout=120, cwd=str(ROOT.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def answer_chat_calls(model: FakeOpenAIServer, answers: list[str]) -> None:
    """The app's chat calls get ``answers``; the scorer's chat calls the default replies."""
    default = model.chat_responder

    def responder(body: dict) -> str:
        messages = body.get("messages") or []
        if messages and messages[0].get("content") == "Be brief.":
            question = messages[-1]["content"]
            return answers[QUESTIONS.index(question)] if question in QUESTIONS else "It depends."
        return default(body)

    model.chat_responder = responder


def tool_call_reply() -> Raw:
    return Raw({"id": "chatcmpl-tool", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}}], "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


# ------------------------------------------------------------------------------ the real instrumentation

MODES = {
    # semantic conventions 1.30 (the instrumentation's default): gen_ai.user.message / gen_ai.choice events
    "events": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"},
    # the latest conventions: gen_ai.client.inference.operation.details events
    "event_only": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"},
    # content on the span only: no join needed
    "span_only": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
    # content on the span and in the event: scored once, the late event ignored
    "span_and_event": {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT"},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_openai_v2_instrumented_app_is_scored_once_per_call(app_python, server, backend, mode):
    """Every chat call is scored exactly once, its EVALUATOR span parented to the chat span;
    the question is the user message (not the system prompt), the answer the first choice."""
    from relevancy_tracer.service import ScoringService

    answer_chat_calls(server, ANSWERS)
    service = ScoringService(openai_settings(server, capture_content=True), http_port=0, grpc_port=None).start()
    try:
        trace_ids = run_app(app_python, f"http://127.0.0.1:{service.server.http_port}", server, QUESTIONS, **MODES[mode])
        assert service.flush(30)
        spans = backend.wait_for_spans(lambda s: len(evaluations(s)) >= 3, timeout=30)
    finally:
        service.stop(10)
    scored = evaluations(spans)
    assert len(scored) == 3 and service.accepted == 3
    assert {s["trace_id"] for s in scored} == set(trace_ids)
    for evaluation in scored:
        assert evaluation["attributes"][A.STATUS] == "scored" and evaluation["links"][0]["span_id"] == evaluation["parent_span_id"]
        assert evaluation["attributes"]["relevancy.evaluated_span.name"] == "chat gpt-4o-mini"
        index = trace_ids.index(evaluation["trace_id"])
        assert evaluation["attributes"][A.INPUT_VALUE] == QUESTIONS[index] and evaluation["attributes"][A.OUTPUT_VALUE] == ANSWERS[index]
    assert sum(service.join.expired.values()) == 0 and len(service.join) == 0


def test_content_capture_off_scores_nothing_and_counts_the_reason(app_python, server, backend, monkeypatch):
    """The app's events carry no content: no evaluation, no model call from the scorer, and
    the calls are counted skipped with reason content_not_captured (exported metric)."""
    from relevancy_tracer.service import ScoringService

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")  # to the backend

    answer_chat_calls(server, ANSWERS)
    service = ScoringService(openai_settings(server, capture_content=True), http_port=0, grpc_port=None).start()
    try:
        run_app(app_python, f"http://127.0.0.1:{service.server.http_port}", server, QUESTIONS[:2], OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="false")
        assert service.flush(30)
    finally:
        service.stop(10)
    assert service.accepted == 0 and service.skipped == {CONTENT_NOT_CAPTURED: 2}
    assert not server.requests_to("embeddings") and len(server.requests_to("chat")) == 2  # the app's two calls only
    assert not evaluations(backend.spans)
    counts = [value for name, attrs, value in backend.metrics if name == "relevancy.evaluations" and attrs.get(A.STATUS) == "skipped" and attrs.get(A.STATUS_REASON) == CONTENT_NOT_CAPTURED]
    assert counts and counts[-1] == 2
    assert all(attrs.get(A.ATTR_SERVICE_NAME) == "genai-app" for name, attrs, _ in backend.metrics if name == "relevancy.evaluations")


def test_a_tool_call_without_text_is_skipped_with_a_reason(app_python, server, backend):
    from relevancy_tracer.service import ScoringService

    answer_chat_calls(server, ANSWERS)
    server.chat.push(tool_call_reply())
    service = ScoringService(openai_settings(server, capture_content=True), http_port=0, grpc_port=None).start()
    try:
        trace_ids = run_app(app_python, f"http://127.0.0.1:{service.server.http_port}", server, ["tool: what is the weather in Lyon?", QUESTIONS[0]], **MODES["events"])
        assert service.flush(30)
        spans = backend.wait_for_spans(lambda s: len(evaluations(s)) >= 1, timeout=30)
    finally:
        service.stop(10)
    assert service.skipped == {TOOL_CALL: 1} and service.accepted == 1
    assert [s["trace_id"] for s in evaluations(spans)] == [trace_ids[1]]


# ------------------------------------------------------------------------------ raw OTLP: orderings, protocols, bounds

TOKEN = "genai-token"


def kv(key: str, value: Any) -> Any:
    from opentelemetry.proto.common.v1 import common_pb2

    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def chat_span(trace_id: bytes, span_id: bytes) -> bytes:
    """A traces export request holding one ``chat`` span without content (as openai-v2 exports)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    span = trace_pb2.Span(trace_id=trace_id, span_id=span_id, name="chat gpt-4o-mini", kind=trace_pb2.Span.SPAN_KIND_CLIENT, attributes=[kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "gpt-4o-mini")])
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(resource=resource_pb2.Resource(attributes=[kv("service.name", "raw-genai")]), scope_spans=[trace_pb2.ScopeSpans(spans=[span])])]).SerializeToString()


def content_events(trace_id: bytes, span_id: bytes, question: str, answer: str) -> Any:
    """A logs export request with the events openai-v2 emits by default for one call."""
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2

    def body(value: dict) -> Any:
        def convert(v: Any) -> Any:
            if isinstance(v, dict):
                return common_pb2.AnyValue(kvlist_value=common_pb2.KeyValueList(values=[common_pb2.KeyValue(key=k, value=convert(x)) for k, x in v.items()]))
            if isinstance(v, int):
                return common_pb2.AnyValue(int_value=v)
            return common_pb2.AnyValue(string_value=v)

        return convert(value)

    records = [
        logs_pb2.LogRecord(time_unix_nano=1, trace_id=trace_id, span_id=span_id, event_name="gen_ai.system.message", body=body({"content": "Be brief."})),
        logs_pb2.LogRecord(time_unix_nano=2, trace_id=trace_id, span_id=span_id, event_name="gen_ai.user.message", body=body({"content": "an earlier question"})),
        logs_pb2.LogRecord(time_unix_nano=3, trace_id=trace_id, span_id=span_id, event_name="gen_ai.user.message", body=body({"content": question})),
        logs_pb2.LogRecord(time_unix_nano=4, trace_id=trace_id, span_id=span_id, event_name="gen_ai.choice", body=body({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}})),
        logs_pb2.LogRecord(time_unix_nano=5, body=body({"content": "an unrelated application log"})),
    ]
    return logs_service_pb2.ExportLogsServiceRequest(resource_logs=[logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=records)])])


def logs_json(request: Any) -> bytes:
    """OTLP/JSON of a logs request (hex ids)."""
    import base64

    from google.protobuf import json_format

    data = json_format.MessageToDict(request)
    for resource_logs in data.get("resourceLogs", []):
        for scope_logs in resource_logs.get("scopeLogs", []):
            for record in scope_logs.get("logRecords", []):
                for key in ("traceId", "spanId"):
                    if key in record:
                        record[key] = base64.b64decode(record[key]).hex()
    return json.dumps(data).encode()


def post(port: int, path: str, body: bytes, content_type: str = "application/x-protobuf", token: Optional[str] = TOKEN) -> int:
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers), timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_spans_and_events_join_in_either_order_over_http_json_and_grpc(server, backend):
    """Events before the span (protobuf), the span before the events (OTLP/JSON), and events
    over gRPC LogsService/Export: each call is scored once with the last user message and the
    first choice; /v1/logs requires the token like /v1/traces."""
    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, capture_content=True, service_token=TOKEN), http_port=0, grpc_port=0).start()
    ids = [(os.urandom(16), os.urandom(8)) for _ in range(3)]
    try:
        port = service.server.http_port
        assert post(port, "/v1/logs", content_events(*ids[0], "Where is Lyon?", "In France.").SerializeToString(), token=None) == 401
        assert post(port, "/v1/logs", content_events(*ids[0], "Where is Lyon?", "In France.").SerializeToString()) == 200
        assert len(service.join) == 1 and service.accepted == 0  # held: no span yet
        assert post(port, "/v1/traces", chat_span(*ids[0])) == 200
        assert service.accepted == 1 and len(service.join) == 0
        assert post(port, "/v1/traces", chat_span(*ids[1])) == 200
        assert len(service.join) == 1 and service.accepted == 1  # held: no content yet
        assert post(port, "/v1/logs", logs_json(content_events(*ids[1], "What is the capital of Italy?", "Rome.")), "application/json") == 200
        assert service.accepted == 2
        assert post(port, "/v1/traces", chat_span(*ids[2])) == 200
        with grpc.insecure_channel(f"127.0.0.1:{service.server.grpc_port}") as channel:
            logs_service_pb2_grpc.LogsServiceStub(channel).Export(content_events(*ids[2], "How tall is Mont Blanc?", "4806 m."), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
        assert service.accepted == 3
        assert post(port, "/v1/logs", content_events(*ids[0], "Where is Lyon?", "In France.").SerializeToString()) == 200  # re-sent: already scored
        assert post(port, "/v1/traces", chat_span(*ids[1])) == 200
        assert service.accepted == 3 and len(service.join) == 0
        assert service.flush(30)
        spans = backend.wait_for_spans(lambda s: len(evaluations(s)) >= 3, timeout=30)
    finally:
        service.stop(10)
    scored = {(s["trace_id"], s["parent_span_id"]): s for s in evaluations(spans)}
    assert set(scored) == {(t.hex(), s.hex()) for t, s in ids}
    questions = [scored[(t.hex(), s.hex())]["attributes"][A.INPUT_VALUE] for t, s in ids]
    assert questions == ["Where is Lyon?", "What is the capital of Italy?", "How tall is Mont Blanc?"]
    assert scored[(ids[1][0].hex(), ids[1][1].hex())]["attributes"][A.OUTPUT_VALUE] == "Rome."


def record(event: str, body: Any, time_ns: int = 1, span: str = "1" * 16) -> ReceivedLog:
    return ReceivedLog(trace_id="a" * 32, span_id=span, event_name=event, body=body, attributes={}, time_ns=time_ns)


def test_content_of_reads_every_event_form():
    """The last user message by time is the question; the lowest choice index the answer; a
    tool call without text and events without content are skipped with their reasons;
    operation.details' structured messages as the latest conventions send them."""
    join = ContentJoin(ttl=10, max_entries=10, max_chars=10_000)
    folded = join.fold([record("gen_ai.choice", {"index": 1, "message": {"content": "second choice"}}), record("gen_ai.user.message", {"content": "last"}, time_ns=5), record("gen_ai.user.message", {"content": "first"}, time_ns=2), record("gen_ai.choice", {"index": 0, "message": {"role": "assistant", "content": [{"type": "text", "text": "first choice"}]}})])
    assert folded[("a" * 32, "1" * 16)].outcome() == (("last", "first choice"), None)
    assert content_of(record("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}}), 1).outcome() == (None, TOOL_CALL)
    off = join.fold([record("gen_ai.user.message", None), record("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}})])
    assert off[("a" * 32, "1" * 16)].outcome() == (None, CONTENT_NOT_CAPTURED)
    details = {"gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Where is Lyon?"}]}], "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "In France."}], "finish_reason": "stop"}]}
    assert content_of(ReceivedLog("a" * 32, "1" * 16, "gen_ai.client.inference.operation.details", None, details), 1).outcome() == (("Where is Lyon?", "In France."), None)
    assert content_of(record("app.log", {"content": "x"}), 1) is None


def test_the_join_buffer_expires_by_reason_and_stays_within_its_bounds():
    now = [0.0]
    dropped: list[tuple[str, int]] = []
    join = ContentJoin(ttl=30, max_entries=3, max_chars=100, on_expired=lambda reason, n: dropped.append((reason, n)), clock=lambda: now[0])
    events = join.fold([record("gen_ai.user.message", {"content": "q" * 10}, span="2" * 16)])
    with join.lock:
        join.commit([], {("a" * 32, "1" * 16): Held(0.0, span=object()), ("a" * 32, "2" * 16): Held(0.0, content=events[("a" * 32, "2" * 16)])})  # type: ignore[arg-type]
        now[0] = 29.0
        join.expire()
        assert len(join) == 2
        now[0] = 30.0
        join.expire()
    assert len(join) == 0 and join.expired == {SPAN_WITHOUT_CONTENT: 1, CONTENT_WITHOUT_SPAN: 1} and join.chars == 0
    with join.lock:
        for i in range(5):  # count bound: the two oldest make room
            join.commit([], {("b" * 32, f"{i + 1:016x}"): Held(now[0])})
        assert len(join) == 3 and join.expired[EVICTED] == 2
        big = join.fold([record("gen_ai.user.message", {"content": "x" * 60}, span="9" * 16), record("gen_ai.user.message", {"content": "y" * 60}, span="8" * 16)])
        join.commit([], {("a" * 32, "9" * 16): Held(now[0], content=big[("a" * 32, "9" * 16)]), ("a" * 32, "8" * 16): Held(now[0], content=big[("a" * 32, "8" * 16)])})
    assert join.chars <= 100 and join.expired[EVICTED] == 2 + 3 + 1  # the three held before and the older 60 characters
    assert dropped == [(SPAN_WITHOUT_CONTENT, 1), (CONTENT_WITHOUT_SPAN, 1), (EVICTED, 1), (EVICTED, 1), (EVICTED, 4)]


def test_openai_v2_app_through_rotel_to_serve(app_python, server, backend, tmp_path):
    """collector-config/rotel.env with its exporter at `serve`: rotel forwards the app's traces
    and its logs (the content events), and every call is scored."""
    from relevancy_tracer.service import ScoringService

    from .test_collector import rotel_to_serve

    answer_chat_calls(server, ANSWERS)
    service = ScoringService(openai_settings(server, capture_content=True), http_port=0, grpc_port=None).start()
    try:
        with rotel_to_serve(service.server.http_port, tmp_path) as rotel_port:
            trace_ids = run_app(app_python, f"http://127.0.0.1:{rotel_port}", server, QUESTIONS, **MODES["events"])
            spans = backend.wait_for_spans(lambda s: len(evaluations(s)) >= 3, timeout=60)
    finally:
        service.stop(10)
    assert sorted(s["trace_id"] for s in evaluations(spans) if s["attributes"][A.STATUS] == "scored") == sorted(trace_ids)


def test_a_full_queue_refuses_the_completing_logs_request_and_keeps_the_held_span(server, backend):
    """Backpressure on /v1/logs as on /v1/traces: the request that completes a call is refused
    with 429 and Retry-After while the queue is full, the held span stays, and the re-sent
    request is joined and scored."""
    from relevancy_tracer.service import ScoringService

    from .test_service_faults import chain_span, export_request

    server.chat_delay = 5.0
    service = ScoringService(openai_settings(server, queue_size=1, concurrency=1, llm_timeout=10.0, service_token=TOKEN), http_port=0, grpc_port=None).start()
    trace_id, span_id = os.urandom(16), os.urandom(8)
    try:
        port = service.server.http_port
        assert [post(port, "/v1/traces", export_request(chain_span(f"q{i}?", f"a{i}.")).SerializeToString()) for i in range(2)] == [200, 200]
        server.wait_for_requests("chat", 1, timeout=10)  # one running, one queued: full
        assert post(port, "/v1/traces", chat_span(trace_id, span_id)) == 200 and len(service.join) == 1
        events = content_events(trace_id, span_id, "Where is Lyon?", "In France.").SerializeToString()
        assert post(port, "/v1/logs", events) == 429 and service.refused == 1
        assert len(service.join) == 1 and service.accepted == 2  # nothing changed
        server.chat_delay = 0.0
        assert service.flush(30)
        assert post(port, "/v1/logs", events) == 200 and service.accepted == 3 and len(service.join) == 0
        assert service.flush(30)
        spans = backend.wait_for_spans(lambda s: len(evaluations(s)) >= 3, timeout=30)
    finally:
        server.chat_delay = 0.0
        service.stop(10)
    assert (trace_id.hex(), span_id.hex()) in {(s["trace_id"], s["parent_span_id"]) for s in evaluations(spans)}


def test_fleet_a_sigkilled_serve_loses_no_joined_call_it_acknowledged(server, backend, tmp_path):
    """In fleet mode the join happens in `serve` before queueing: the export request that
    completes a call is answered 200 only after its job is on the Redis Stream, so killing
    `serve` with SIGKILL right after leaves the job there for the workers."""
    import redis

    from relevancy_tracer.otel.results import evaluation_id
    from relevancy_tracer.service.jobs import ScoreRequest
    from relevancy_tracer.service.queue import STREAM
    from relevancy_tracer_testing import RedisServer

    from .test_service_faults import TOKEN as SERVE_TOKEN, start_serve

    with RedisServer(str(tmp_path)) as redis_server:
        serve = start_serve(tmp_path, server, backend, "--queue", redis_server.url)
        try:
            trace_id, span_id = os.urandom(16), os.urandom(8)
            assert post(serve.http_port, "/v1/logs", content_events(trace_id, span_id, "Where is Lyon?", "In France.").SerializeToString(), token=SERVE_TOKEN) == 200
            assert post(serve.http_port, "/v1/traces", chat_span(trace_id, span_id), token=SERVE_TOKEN) == 200
        finally:
            serve.proc.kill()
            serve.proc.wait(10)
        client = redis.Redis.from_url(redis_server.url)
        try:
            entries = client.xrange(STREAM)
        finally:
            client.close()
    assert len(entries) == 1
    job = ScoreRequest.from_json(entries[0][1][b"job"])
    assert (job.trace_id, job.span_id, job.question, job.answer) == (trace_id.hex(), span_id.hex(), "Where is Lyon?", "In France.")
    assert job.evaluation_id == evaluation_id(trace_id.hex(), span_id.hex(), "ragas") and job.service_name == "raw-genai"


def test_bad_logs_requests_are_answered_like_bad_trace_requests(server, no_exports):
    """/v1/logs and LogsService/Export under the receiver's rules: garbage 400 /
    INVALID_ARGUMENT, a JSON array 400, above max_request_bytes 413, gzip inflated; a logs
    request that is all application logs is answered 200 and holds nothing."""
    import gzip

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2

    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, service_token=TOKEN, max_request_bytes=64 * 1024), http_port=0, grpc_port=0).start()
    try:
        port = service.server.http_port
        assert post(port, "/v1/logs", b"\xff\x00 not protobuf") == 400
        assert post(port, "/v1/logs", b"[1, 2]", "application/json") == 400
        assert post(port, "/v1/logs", b"x" * (65 * 1024)) == 413
        body = content_events(os.urandom(16), os.urandom(8), "q?", "a.").SerializeToString()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/logs", data=gzip.compress(body), headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip", "Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200
        assert len(service.join) == 1  # the events wait for their span
        plain = logs_service_pb2.ExportLogsServiceRequest(resource_logs=[logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=[logs_pb2.LogRecord(trace_id=os.urandom(16), span_id=os.urandom(8), event_name="app.request")])])])
        assert post(port, "/v1/logs", plain.SerializeToString()) == 200 and len(service.join) == 1
        with grpc.insecure_channel(f"127.0.0.1:{service.server.grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
            with pytest.raises(grpc.RpcError) as bad:
                export(b"\xff\x00 not protobuf", metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as denied:
                export(body, timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        service.stop(10)
