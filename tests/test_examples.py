"""Every example runs as its docstring says: subprocesses exporting over OTLP to a receiver.

The answers are scored by a real HTTP model server on 127.0.0.1 (the local models' path is
exercised by the demo test); retrieval uses the embedded USE as in production.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

from relevancy_tracer._phoenix_server import free_port
from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver

from .conftest import ROOT, WIKIEVAL, fake_model_env, subprocess_env

EXAMPLES = ROOT / "examples"


def example_env(server: FakeOpenAIServer, receiver: OTLPReceiver) -> dict:
    return subprocess_env(fake_model_env(server), OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint, OTEL_METRICS_EXPORTER="none")


def scored_spans(receiver: OTLPReceiver, name: str, count: int) -> list[dict]:
    spans = receiver.wait_for_spans(lambda spans: sum(1 for s in spans if s["name"] == name) >= count, timeout=60)
    return [s for s in spans if s["name"] == name]


def test_rag_app_answers_and_scores(server):
    with OTLPReceiver(grpc=False) as receiver:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / "rag_app.py"), "--extractive", "What does the pass statement do?", "What is the capital of Australia?"],
            env=example_env(server, receiver), capture_output=True, text=True, timeout=300, cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "A: I don't know" in proc.stdout and "scored:" in proc.stdout
        spans = scored_spans(receiver, "python_docs_rag.answer", 2)
    by_question = {s["attributes"]["input.value"]: s["attributes"] for s in spans}
    passed = by_question["What does the pass statement do?"]
    assert passed["relevancy.status"] == "scored" and "pass" in passed["output.value"].lower()
    assert "pass" in passed["retrieval.documents.0.document.content"].lower()
    unknown = by_question["What is the capital of Australia?"]
    assert unknown["relevancy.status"] == "scored" and unknown["output.value"].startswith("I don't know")


def test_web_service_requests_are_traced_and_scored(server):
    port = free_port()
    with OTLPReceiver(grpc=False) as receiver:
        env = example_env(server, receiver)
        env["EXAMPLE_GENERATOR"] = "extractive"
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "examples.web_service:app", "--port", str(port)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline, reply = time.monotonic() + 120, None
            while time.monotonic() < deadline and reply is None:
                try:
                    request = urllib.request.Request(f"http://127.0.0.1:{port}/ask", data=json.dumps({"question": "What does the pass statement do?"}).encode(), headers={"content-type": "application/json"})
                    with urllib.request.urlopen(request, timeout=30) as response:
                        reply = json.loads(response.read())
                except OSError:
                    assert proc.poll() is None, proc.stdout.read()
                    time.sleep(0.3)
            assert reply is not None and "pass" in reply["answer"].lower() and reply["topics"]
        finally:
            proc.send_signal(signal.SIGINT)  # uvicorn's lifespan shutdown flushes the tracer
            output, _ = proc.communicate(timeout=60)
        spans = scored_spans(receiver, "qa.ask", 1)
        server_spans = [s for s in receiver.spans if s["name"] == "POST /ask"]
    attrs = spans[0]["attributes"]
    if server_spans:  # FastAPI's own OpenTelemetry server span, when present: same trace
        assert spans[0]["trace_id"] == server_spans[0]["trace_id"] and spans[0]["parent_span_id"]
    assert attrs["input.value"] == "What does the pass statement do?" and attrs["output.value"] == reply["answer"]
    assert attrs["relevancy.status"] == "scored" and 0 < attrs["relevancy.score"] <= 1, output


def test_batch_scoring_example(server, tmp_path):
    out = tmp_path / "scores.csv"
    with OTLPReceiver(grpc=False) as receiver:
        proc = subprocess.run([sys.executable, str(EXAMPLES / "batch_scoring.py"), str(WIKIEVAL), "--limit", "3", "--out", str(out)], env=example_env(server, receiver), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "complete answer scored above the poor one" in proc.stdout and "'scored': 6" in proc.stdout
    assert len(out.read_text().splitlines()) > 6


def test_langchain_style_instrument(server):
    with OTLPReceiver(grpc=False) as receiver:
        proc = subprocess.run([sys.executable, str(EXAMPLES / "langchain_style.py"), "What does the pass statement do?"], env=example_env(server, receiver), capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = scored_spans(receiver, "RetrievalQAChain.invoke", 1)
    attrs = spans[0]["attributes"]
    assert attrs["input.value"] == "What does the pass statement do?" and attrs["relevancy.status"] == "scored"
    assert "retrieval.documents.0.document.content" in attrs
