"""Arize Phoenix as the real OTLP backend: spans read back over its REST API; the demo."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from relevancy_tracer._phoenix_server import PhoenixServer
from relevancy_tracer_testing import FakeOpenAIServer

from .conftest import ROOT, fake_model_env, subprocess_env

pytestmark = pytest.mark.phoenix

APP = textwrap.dedent(
    """
    import relevancy_tracer

    relevancy_tracer.configure()

    @relevancy_tracer.trace(name="phoenix_answer")
    def answer(question: str) -> dict:
        return {"answer": "France is in western Europe and Paris is its capital.",
                "contexts": ["Paris is the capital and largest city of France."]}

    answer("Where is France and what is its capital?")
    assert relevancy_tracer.shutdown(60)
    """
)


def run_app(phoenix: PhoenixServer, project: str, protocol: str, model: FakeOpenAIServer) -> None:
    endpoint = phoenix.url if protocol == "http/protobuf" else f"http://127.0.0.1:{phoenix.grpc_port}"
    env = subprocess_env(
        fake_model_env(model),
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}",
        OTEL_METRICS_EXPORTER="none",
    )
    proc = subprocess.run([sys.executable, "-c", APP], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_relevancy_attributes_arrive_in_phoenix(phoenix, server, protocol):
    project = "otlp-" + protocol.split("/")[0]
    run_app(phoenix, project, protocol, server)
    spans = phoenix.wait_for_spans(project, lambda s: any("relevancy.score" in (x.get("attributes") or {}) for x in s), timeout=60, name=["phoenix_answer"])
    assert len(spans) == 1, spans
    attrs = spans[0]["attributes"]
    assert attrs["input.value"] == "Where is France and what is its capital?"
    assert attrs["output.value"] == "France is in western Europe and Paris is its capital."
    assert attrs["relevancy.status"] == "scored" and 0 < attrs["relevancy.score"] <= 1
    assert len(attrs["relevancy.generated_questions"]) == 3 and spans[0]["span_kind"] == "CHAIN"  # Phoenix lifts the kind out of the attributes
    assert attrs["retrieval.documents.0.document.content"].startswith("Paris is the capital")
    assert [e["name"] for e in spans[0].get("events", [])] == ["gen_ai.evaluation.result"]


@pytest.mark.local_models
def test_demo_scores_answers_into_phoenix(phoenix, tmp_path):
    """`relevancy-tracer demo`: the example RAG app on the embedded models, traced into Phoenix
    (the module's Phoenix, which the demo finds running on PHOENIX_PORT and reuses)."""
    env = subprocess_env(PHOENIX_PORT=str(phoenix.port))
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "demo", "--questions", "3"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "3 of 3 answers scored" in out and "Phoenix has 3 of this run's answer spans with relevancy attributes" in out
    assert "Using the Phoenix already running" in out
    assert out.count("/redirects/traces/") == 3 and "/redirects/projects/relevancy-tracer-demo" in out
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0].replace(".", "", 1).isdigit() and "  " in line:
            question = line[30:78].strip()
            rows[question] = float(parts[0])
    assert len(rows) == 3, out
    unknown = [score for question, score in rows.items() if "Australia" in question]
    known = [score for question, score in rows.items() if "Australia" not in question]
    assert unknown and unknown[0] < min(known), rows


#: Where the browser test saves its screenshot (read at import: the autouse fixture clears
#: RELEVANCY_TRACER_* variables from the environment the tests see).
SCREENSHOT = os.environ.get("RELEVANCY_TRACER_SCREENSHOT")

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.mark.browser
def test_phoenix_ui_shows_the_relevancy_attributes(phoenix, server, tmp_path):
    """Headless Chromium opens an answer's trace in Phoenix's UI and finds the relevancy
    attributes on the span. Uses the demo's traces (real local-model scores) when the demo test
    ran, else makes one. The screenshot goes to RELEVANCY_TRACER_SCREENSHOT when set
    (docs/images/phoenix-trace.png, by ``python -m benchmarks.examples screenshot``), else into
    the test's temp dir; beside it a sidecar (``.json``) says what the span in the picture
    carries (method, evaluator version, models, label, score), which tests/test_figures.py
    compares with the current default, since a picture cannot be compared."""
    from playwright.sync_api import sync_playwright

    from benchmarks.examples import screenshot_sidecar

    spans = [s for s in phoenix.spans("relevancy-tracer-demo", name=["python_docs_rag.answer"]) if (s.get("attributes") or {}).get("relevancy.status") == "scored"]
    if not spans:
        run_app(phoenix, "ui", "http/protobuf", server)
        spans = phoenix.wait_for_spans("ui", lambda s: any("relevancy.score" in (x.get("attributes") or {}) for x in s), timeout=60)
    span = max(spans, key=lambda s: s["attributes"]["relevancy.score"])
    attrs = span["attributes"]
    screenshot = Path(SCREENSHOT or tmp_path / "phoenix-trace.png")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1100})
            page.goto(phoenix.trace_url(span["context"]["trace_id"]), wait_until="networkidle", timeout=90000)
            page.get_by_test_id("trace-tree").get_by_text(span["name"]).first.click(timeout=60000)  # not the list behind the drawer
            page.get_by_role("tab", name="Attributes").first.click(timeout=60000)
            row = page.get_by_role("row").filter(has_text="relevancy.score")
            row.first.wait_for(timeout=60000)
            assert str(attrs["relevancy.score"])[:6] in row.first.inner_text()
            body = page.inner_text("body")
            for key in ("relevancy.label", "relevancy.generated_questions.0", "relevancy.similarities.0", "input.value", "output.value"):
                assert key in body, key
            assert attrs["relevancy.label"] in body and attrs["relevancy.generated_questions"][0][:30] in body
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
    sidecar = screenshot_sidecar(screenshot, span)
    written = json.loads(screenshot.with_suffix(".json").read_text(encoding="utf-8"))
    assert written == sidecar and written["evaluator_version"] == attrs["relevancy.evaluator.version"] and written["label"] == attrs["relevancy.label"], written


ANNOTATED_APP = textwrap.dedent(
    """
    import relevancy_tracer

    relevancy_tracer.configure()

    @relevancy_tracer.trace(name="annotated_answer")
    def answer(question: str) -> str:
        return "France is in western Europe and Paris is its capital."

    answer("Where is France and what is its capital?")
    assert relevancy_tracer.shutdown(60)
    """
)


def run_annotated_app(phoenix: PhoenixServer, server: FakeOpenAIServer, project: str, capture: str) -> list[dict]:
    """Run ANNOTATED_APP with the Phoenix sink on; returns its answer span once stored."""
    env = subprocess_env(
        fake_model_env(server),
        OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.url,
        OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}",
        OTEL_METRICS_EXPORTER="none",
        RELEVANCY_TRACER_PHOENIX_URL=phoenix.url,
        RELEVANCY_TRACER_CAPTURE_CONTENT=capture,
    )
    proc = subprocess.run([sys.executable, "-c", ANNOTATED_APP], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return phoenix.wait_for_spans(project, lambda s: len(s) == 1, timeout=60, name=["annotated_answer"])


@pytest.mark.parametrize("capture", ["true", "false"])
def test_scores_become_phoenix_span_annotations_upserted_by_evaluation_id(phoenix, server, capture):
    """With ``phoenix_url`` set, each scored span gets one ``answer_relevancy`` annotation (the
    badge Phoenix shows in its trace tree); writing it again with the same evaluation id
    replaces it; with content capture off its metadata holds no generated question."""
    from relevancy_tracer.phoenix_annotations import ANNOTATION_NAME, PhoenixClient

    project = f"annotations-{capture}"
    spans = run_annotated_app(phoenix, server, project, capture)
    span_id = spans[0]["context"]["span_id"]
    client = PhoenixClient(phoenix.url)
    try:
        # The sink posts with sync=false: Phoenix accepts at once and applies the annotation when
        # its span is stored, postponing and retrying meanwhile; wait for it to be applied.
        deadline = time.monotonic() + 60
        while True:
            page = client._request("GET", f"/v1/projects/{project}/span_annotations", params=[("span_ids", span_id)])
            annotations = [a for a in page["data"] if a["name"] == ANNOTATION_NAME]
            if annotations or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert len(annotations) == 1, page
        annotation = annotations[0]
        assert annotation["annotator_kind"] == "LLM" and annotation["result"]["score"] == spans[0]["attributes"]["relevancy.score"]
        assert annotation["result"]["label"] == spans[0]["attributes"]["relevancy.label"]
        assert annotation["metadata"]["evaluator_version"] == spans[0]["attributes"]["relevancy.evaluator.version"]
        assert ("generated_questions" in annotation["metadata"]) == (capture == "true")
        # A retried evaluation writes the same identifier: Phoenix replaces, never doubles.
        again = dict(span_id=span_id, name=ANNOTATION_NAME, annotator_kind="LLM", identifier=annotation["identifier"], result={"score": 0.5, "label": "x", "explanation": "retry"}, metadata={})
        client.annotate([again], sync=True)
        page = client._request("GET", f"/v1/projects/{project}/span_annotations", params=[("span_ids", span_id)])
        annotations = [a for a in page["data"] if a["name"] == ANNOTATION_NAME]
        assert len(annotations) == 1 and annotations[0]["result"]["score"] == 0.5, page
        assert client.annotated_span_ids(project, [span_id, "0" * 16]) == {span_id}
    finally:
        client.close()


def test_backfill_scores_stored_spans_once_and_a_second_run_scores_nothing(phoenix, server, tmp_path):
    """200 spans of an app that never imported this package, stored in Phoenix: `backfill`
    annotates every one; run again, it finds them annotated and scores nothing."""
    from relevancy_tracer.phoenix_annotations import ANNOTATION_NAME, PhoenixClient

    from .test_service import run_otel_only_app

    project = "otel-only"  # the app's resource names its Phoenix project
    ids = run_otel_only_app(phoenix.url, openinference=150, genai=50)
    phoenix.wait_for_spans(project, lambda s: len(s) >= 200, timeout=90, name=["rag.answer", "chat gpt-4o"])
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "backfill", "--phoenix", phoenix.url, "--project", project, "--state", str(tmp_path / "cursor.json"), "--method", "ragas"]
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_CONCURRENCY="8")
    runs = []
    for _ in range(2):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["scored"] == 200 and runs[0]["failed"] == 0, runs
    assert runs[1]["scored"] == 0 and runs[1]["already_annotated"] == 200, runs
    client = PhoenixClient(phoenix.url)
    try:
        span_ids = [span_id for _, _, span_id in ids]
        assert client.annotated_span_ids(project, span_ids, ANNOTATION_NAME) == set(span_ids)
        page = client._request("GET", f"/v1/projects/{project}/span_annotations", params=[("span_ids", s) for s in span_ids[:50]] + [("limit", 1000)])
        assert len([a for a in page["data"] if a["name"] == ANNOTATION_NAME]) == 50  # one each, never doubled
    finally:
        client.close()
    assert not (tmp_path / "cursor.json").exists()  # a finished run leaves no cursor to resume


def test_backfill_stopped_by_sigterm_annotates_what_it_finished_and_the_next_run_resumes(phoenix, tmp_path):
    """SIGTERM while a page is being scored: the scores finished by then are annotated, the
    run exits 143 saying it was interrupted, and the next run scores only the rest."""
    import signal

    from relevancy_tracer.phoenix_annotations import PhoenixClient

    from .test_service import run_otel_only_app

    project = "otel-only-stopped"
    span_ids = [span_id for _, _, span_id in run_otel_only_app(phoenix.url, openinference=30, genai=0, project=project)]
    phoenix.wait_for_spans(project, lambda s: len(s) >= 30, timeout=90, name=["rag.answer"])
    state = tmp_path / "cursor.json"
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "backfill", "--phoenix", phoenix.url, "--project", project, "--state", str(state), "--method", "ragas"]
    with FakeOpenAIServer(chat_delay=0.2) as model:
        env = subprocess_env(fake_model_env(model), RELEVANCY_TRACER_CONCURRENCY="1")
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert model.wait_for_requests("embeddings", 4, timeout=120)  # one embeddings request a span: 3 spans scored
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    first = json.loads(stdout.strip().splitlines()[-1])
    assert first["interrupted"] and 3 <= first["scored"] < 30 and first["failed"] == 0, first
    client = PhoenixClient(phoenix.url)
    try:
        assert len(client.annotated_span_ids(project, span_ids)) == first["scored"]
        with FakeOpenAIServer() as model:
            proc = subprocess.run(command, env=subprocess_env(fake_model_env(model)), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        second = json.loads(proc.stdout.strip().splitlines()[-1])
        assert second["already_annotated"] == first["scored"] and second["scored"] == 30 - first["scored"], second
        assert client.annotated_span_ids(project, span_ids) == set(span_ids)
    finally:
        client.close()
    assert not state.exists()


@pytest.mark.browser
def test_phoenix_trace_tree_shows_the_annotation_badge(phoenix, server, tmp_path):
    """Headless Chromium opens a trace whose answer span was annotated by the sink and finds
    the ``answer_relevancy`` annotation with its label in the page. The screenshot goes to
    RELEVANCY_TRACER_ANNOTATION_SCREENSHOT when set
    (docs/images/phoenix-annotation.png), else into the test's temp dir."""
    from playwright.sync_api import sync_playwright

    from relevancy_tracer.phoenix_annotations import PhoenixClient

    span = run_annotated_app(phoenix, server, "annotation-badge", "true")[0]
    client = PhoenixClient(phoenix.url)
    try:  # the sink writes asynchronously: open the page once Phoenix has the annotation
        deadline = time.monotonic() + 60
        while not client.annotated_span_ids("annotation-badge", [span["context"]["span_id"]]) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        client.close()
    screenshot = Path(ANNOTATION_SCREENSHOT or tmp_path / "phoenix-annotation.png")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(phoenix.trace_url(span["context"]["trace_id"]), wait_until="networkidle", timeout=90000)
            page.get_by_text("answer_relevancy").first.wait_for(timeout=60000)
            body = page.inner_text("body")
            at = body.find("answer_relevancy")
            score = span["attributes"]["relevancy.score"]
            shown = {f"{score:.2f}", f"{math.floor(score * 100) / 100:.2f}"}  # Phoenix truncates: "μ 0.92" for 0.9286
            assert at >= 0 and any(text in body[at:] for text in shown), (score, body[max(0, at - 300) : at + 700])
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000


ANNOTATION_SCREENSHOT = os.environ.get("RELEVANCY_TRACER_ANNOTATION_SCREENSHOT")
