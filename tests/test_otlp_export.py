"""End to end over real OTLP: an app process exports to a receiver on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver

from .conftest import ROOT, fake_model_env, subprocess_env

APP = textwrap.dedent(
    """
    import sys
    import relevancy_tracer

    relevancy_tracer.configure()

    @relevancy_tracer.trace
    def answer(question: str) -> str:
        return "France is in western Europe and Paris is its capital."

    print(answer("Where is France and what is its capital?"))
    if sys.argv[1] == "explicit":
        assert relevancy_tracer.shutdown(60)
    # else: shutdown runs at interpreter exit
    """
)


def run_app(env_extra: dict, mode: str = "explicit", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", APP, mode], env=subprocess_env(env_extra), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def relevancy_span(receiver: OTLPReceiver) -> dict:
    spans = receiver.wait_for_spans(lambda spans: any("relevancy.score" in s["attributes"] for s in spans), timeout=30)
    matching = [s for s in spans if s["name"] == "answer"]
    assert len(matching) == 1, spans
    return matching[0]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_span_and_metrics_reach_an_otlp_receiver(protocol):
    with FakeOpenAIServer() as server, OTLPReceiver() as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        proc = run_app({**fake_model_env(server), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_SERVICE_NAME": "rag-e2e"})
        assert proc.returncode == 0, proc.stderr
        span = relevancy_span(receiver)
        a = span["attributes"]
        assert span["resource"]["service.name"] == "rag-e2e" and span["kind"] == 1  # INTERNAL
        assert a["relevancy.status"] == "scored" and 0 < a["relevancy.score"] <= 1 and len(a["relevancy.generated_questions"]) == 3
        assert a["input.value"] == "Where is France and what is its capital?" and a["output.value"].startswith("France is in western Europe")
        assert a["openinference.span.kind"] == "CHAIN"
        assert [e["name"] for e in span["events"]] == ["gen_ai.evaluation.result"]
        assert span["events"][0]["attributes"]["gen_ai.evaluation.score.value"] == a["relevancy.score"]
        histograms = [value for name, attrs, value in receiver.metrics if name == "relevancy.score" and attrs.get("span.name") == "answer"]
        assert histograms and histograms[-1]["bounds"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
        assert any(name == "relevancy.evaluations" and attrs.get("relevancy.status") == "scored" and attrs.get("service.name") == "rag-e2e" for name, attrs, _ in receiver.metrics)


def test_shutdown_at_interpreter_exit_exports_held_spans():
    with FakeOpenAIServer() as server, OTLPReceiver(grpc=False) as receiver:
        proc = run_app({**fake_model_env(server), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}, mode="atexit")
        assert proc.returncode == 0, proc.stderr
        assert relevancy_span(receiver)["attributes"]["relevancy.status"] == "scored"


def test_otel_sdk_disabled_exports_nothing_and_the_app_runs():
    with FakeOpenAIServer() as server, OTLPReceiver(grpc=False) as receiver:
        proc = run_app({**fake_model_env(server), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "OTEL_SDK_DISABLED": "true"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "France is in western Europe and Paris is its capital."
        assert receiver.spans == [] and receiver.metrics == []


@pytest.mark.local_models
def test_readme_example_with_the_embedded_local_models():
    """The README's example: the span exported over OTLP carries a score and generated
    questions computed by the embedded local models (no model server at all)."""
    with OTLPReceiver(grpc=False) as receiver:
        proc = run_app({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "RELEVANCY_TRACER_LLM": "local", "RELEVANCY_TRACER_EMBEDDINGS": "local"}, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        span = relevancy_span(receiver)
        a = span["attributes"]
        assert a["relevancy.status"] == "scored" and a["relevancy.llm.model"] == "qwen2.5-coder-1.5b"
        assert a["relevancy.embedding.model"] == "use-multilingual-v3" and 0 < a["relevancy.score"] <= 1
        assert len(a["relevancy.generated_questions"]) == 3 and all(q.strip() for q in a["relevancy.generated_questions"])
