"""`serve` scores apps instrumented by OpenTelemetry's own GenAI instrumentation, whose content
travels as OTLP log events (issue 27).

The real instrumentation: a plain ``openai`` app instrumented by
``opentelemetry-instrumentation-openai-v2`` runs in a virtual environment of its own (built once
per module with the pins of :data:`APP_REQUIREMENTS`; the versions it shares with this project's
venv are constrained to this venv's, so pip takes them from its cache), calls the scripted
OpenAI-compatible server, and exports traces and logs over OTLP/HTTP to an in-process
:class:`~relevancy_tracer.service.ScoringService`, whose EVALUATOR spans go to an
:class:`~relevancy_tracer.testing.OTLPReceiver`. Raw OTLP requests (protobuf, JSON, gRPC) cover
the join's orderings, expiry and bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from importlib import metadata
from typing import Any, Optional

import pytest

from relevancy_tracer.otel import attributes as A
from relevancy_tracer.service.join import CONTENT_NOT_CAPTURED, CONTENT_WITHOUT_SPAN, EVICTED, SPAN_WITHOUT_CONTENT, TOOL_CALL, ContentJoin, Held, content_of
from relevancy_tracer.service.otlp import ReceivedLog
from relevancy_tracer.testing import FakeOpenAIServer, OTLPReceiver, Raw

from .conftest import ROOT, openai_settings, subprocess_env

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


@pytest.fixture
def backend(monkeypatch):
    """The service's tracing and metrics backend."""
    with OTLPReceiver(grpc=False) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "relevancy-tracer-service")
        yield receiver


def evaluations(spans: list[dict]) -> list[dict]:
    return [s for s in spans if s["attributes"].get(A.OPENINFERENCE_SPAN_KIND) == A.SPAN_KIND_EVALUATOR]


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


def test_content_capture_off_scores_nothing_and_counts_the_reason(app_python, server, backend):
    """The app's events carry no content: no evaluation, no model call from the scorer, and
    the calls are counted skipped with reason content_not_captured (exported metric)."""
    from relevancy_tracer.service import ScoringService

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
