"""The real-client matrix (issue 34): real instrumentations, pinned, each in an environment of its
own, drive a small app against the scripted OpenAI-compatible model and export OTLP to a real
in-process `serve`; each call must be scored exactly once with the exact question (the last
user turn, never the system prompt holding the context) and answer.

Environments (``tests/sources/``): Python venvs from ``NAME.txt`` pins, and the Vercel AI SDK's
Node project (``vercel/package.json`` + ``package-lock.json``, ``npm ci``), built once under
``~/.cache/relevancy-tracer/sources/`` (``$XDG_CACHE_HOME``) keyed by the hash of their pins, so
a fresh clone reuses them (pip and npm cache their downloads too). Building all of them took
325 s on this 2-core machine with pip's cache warm, plus 23 s for the traceloop-sdk one (32 s
with an empty pip cache) and 16 s for the LangChain one (empty pip cache); with them built the
matrix runs in ~60 s. Each
case runs with a ``SimpleSpanProcessor`` (every span exported alone) and a
``BatchSpanProcessor``; the simple one through a proxy that answers the first export request
503 after `serve` took it, so the exporter re-sends it (a retry of a request already taken).
"""

from __future__ import annotations

import fcntl
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from relevancy_tracer_testing import FakeOpenAIServer

from .conftest import ROOT, openai_settings, subprocess_env
from .test_service import backend, evaluator_spans  # noqa: F401 - backend is a fixture
from .test_service_faults import no_exports  # noqa: F401 - a fixture

SOURCES = ROOT / "tests" / "sources"
#: Built environments, keyed by the hash of their pins (and Python's version): a cache outside
#: the checkout, so a fresh clone (CI) reuses the environments of earlier runs on the machine.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relevancy-tracer" / "sources"

#: Two calls: one turn, then a multi-turn conversation whose last user turn is the question.
CONVERSATIONS = [
    [{"role": "user", "content": "Where is Lyon?"}],
    [{"role": "user", "content": "Where is Lyon?"}, {"role": "assistant", "content": "Lyon is in France."}, {"role": "user", "content": "On which river is Lyon?"}],
]
ANSWERS = {"Where is Lyon?": "Lyon is in France.", "On which river is Lyon?": "Lyon is on the Rhone."}
SYSTEM = "Answer from this context only. Context: Lyon lies on the Rhone and the Saone."

#: Sources whose scored span does not hold the earlier turns in a readable form: LlamaIndex's
#: ContextChatEngine span records its chat_history as Python reprs of ChatMessage objects,
#: which are never parsed (the follow-up is then judged as a single turn)
NO_HISTORY = {"openinference_llama_index"}

#: (source, environment, convention read): the environment is a Python pins file name, or
#: "vercel" for the Node project; the convention the service must read the calls by.
MATRIX = [
    ("openinference_openai", "openinference_openai", "openinference"),
    ("vercel_ai", "vercel", "vercel_ai"),
    ("openinference_vercel", "vercel", "openinference"),
    ("vercel_ai_stream", "vercel", "vercel_ai"),  # streamText: ai.streamText / ai.streamText.doStream
    ("openinference_vercel_stream", "vercel", "openinference"),
    ("openllmetry_events", "openllmetry_0_52_6", "genai-events"),  # llm.request.type=chat, content as log events
    ("openllmetry_legacy", "openllmetry_0_52_6", "genai"),  # gen_ai.prompt.N.* attributes
    ("openllmetry_events", "openllmetry_0_62_4", "genai-events"),
    ("openllmetry_legacy", "openllmetry_0_62_4", "genai"),
    ("openinference_llama_index", "openinference_llama_index", "openinference"),  # query and chat engines: nested CHAIN and LLM spans
    ("langfuse", "langfuse", "langfuse"),  # langfuse.observation.input / output: an @observe span around a generation
    ("logfire", "logfire", "genai"),  # OpenTelemetry mode; "simple" exports every span twice
    ("traceloop_workflow", "traceloop_0_62_4", "traceloop"),  # Traceloop.init: @workflow > @task > openai.chat; the workflow is scored
    ("traceloop_method", "traceloop_0_62_4", "traceloop"),  # an unnamed @workflow method: {"args": ["Assistant", messages]}
    ("openllmetry_langchain", "openllmetry_langchain_0_62_4", "traceloop"),  # prompt | ChatOpenAI: the RunnableSequence.workflow root, {"inputs": {"question", "history"}}
]


def _locked_build(name: str, key: str, build: Any) -> Path:
    """The directory ``.work/sources/<name>-<key>``, built once by ``build(directory)`` (under a
    file lock: parallel runs wait; a failed build leaves nothing behind)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    directory = CACHE / f"{name}-{key}"
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".built").exists():
            shutil.rmtree(directory, ignore_errors=True)
            try:
                build(directory)
            except BaseException:
                shutil.rmtree(directory, ignore_errors=True)
                raise
            (directory / ".built").touch()
    return directory


def python_environment(name: str) -> str:
    """The python of the venv pinned by ``tests/sources/<name>.txt``."""
    pins = SOURCES / f"{name}.txt"
    key = hashlib.sha256(pins.read_bytes() + sys.version.encode()).hexdigest()[:12]

    def build(directory: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True, timeout=300)
        python = str(directory / "bin" / "python")
        proc = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(pins)], capture_output=True, text=True, timeout=900, env=subprocess_env())
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr

    return str(_locked_build(name, key, build) / "bin" / "python")


def node_environment() -> Path:
    """The Vercel AI SDK project (``npm ci`` of ``tests/sources/vercel``'s lock file)."""
    project = SOURCES / "vercel"
    files = ["package.json", "package-lock.json", "app.mjs"]
    key = hashlib.sha256(b"".join((project / f).read_bytes() for f in files)).hexdigest()[:12]  # node_modules hold no Python
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are needed (.ci/system-deps installs them)"

    def build(directory: Path) -> None:
        directory.mkdir(parents=True)
        for f in files:
            shutil.copy(project / f, directory / f)
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"], cwd=directory, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    return _locked_build("vercel", key, build)


#: Bytes of an OTLP protobuf request holding a candidate span (OpenInference kinds as string
#: values, the Vercel AI SDK's answer, OpenLLMetry's request type, GenAI attributes, Langfuse's output).
CANDIDATE_MARKERS = (b"\n\x05CHAIN", b"\n\x03LLM", b"\n\x05AGENT", b"ai.response.text", b"llm.request.type", b"gen_ai.operation.name", b"gen_ai.prompt", b"gen_ai.input.messages", b"langfuse.observation.output")


class RetryProxy:
    """An HTTP proxy in front of `serve` that forwards every request and, for the first
    ``/v1/traces`` request holding a candidate span, answers 503 once `serve` answered 200: the exporter re-sends a
    request `serve` already took (as when its answer is lost). Reads chunked bodies (Node)."""

    def __init__(self, target: str):
        self.target = target
        self.dropped = 0
        self.forwarded = 0
        self.resent = 0  # the dropped request seen again
        self._dropped_body = b""
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self._body()
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "content-encoding")}
                request = urllib.request.Request(owner.target + self.path, data=body, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=30) as reply:
                        status, payload = reply.status, reply.read()
                except urllib.error.HTTPError as exc:
                    status, payload = exc.code, exc.read()
                owner.forwarded += 1
                owner.resent += body == owner._dropped_body
                if status == 200 and self.path == "/v1/traces" and not owner.dropped and any(marker in body for marker in CANDIDATE_MARKERS):
                    owner.dropped += 1
                    owner._dropped_body = body
                    status, payload = 503, b""
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(payload)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def app_model() -> Iterator[FakeOpenAIServer]:
    """The app's own model: answers each conversation's last user turn."""

    def responder(body: dict) -> str:
        last = str(body["messages"][-1].get("content"))
        return next((answer for question, answer in ANSWERS.items() if question in last), "I do not know.")  # LlamaIndex fills a template

    with FakeOpenAIServer(chat_responder=responder) as model:
        yield model


def run_app(environment: str, source: str, processor: str, endpoint: str, model: FakeOpenAIServer, **app_env: str) -> list[str]:
    """Run the source's app (``app_env``: more environment variables); the trace id of each call."""
    env = subprocess_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", SOURCE=source, PROCESSOR=processor, **app_env)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if environment == "vercel":
        directory = node_environment()
        command = ["node", str(directory / "app.mjs")]
    else:
        command = [python_environment(environment), str(SOURCES / "python_app.py")]
    proc = subprocess.run(command + [model.base_url, json.dumps(CONVERSATIONS)], env=env, capture_output=True, text=True, timeout=180, cwd=str(ROOT.parent))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # no exporter of the app failed against `serve` (traceloop-sdk exports its metrics to the
    # same endpoint); Langfuse's own exporter posts to Langfuse's ingestion path, which `serve`
    # does not serve (its spans reach `serve` through the app's exporter)
    failures = [line for line in proc.stderr.splitlines() if "Failed to export" in line and not (source == "langfuse" and "spans batch code: 404" in line)]
    assert not failures, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("processor", ["simple", "batch"])
@pytest.mark.parametrize("source, environment, convention", MATRIX, ids=[m[0] if m[1] in ("vercel", m[0]) else f"{m[0]}-{m[1]}" for m in MATRIX])
def test_each_call_of_a_real_instrumentation_is_scored_once_with_its_question_and_answer(source, environment, convention, processor, server, app_model, backend):
    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, decision_wait=30.0), http_port=0, grpc_port=None).start()
    queued: list[tuple[str, str, str]] = []
    offer = service._offer
    conventions: set[str] = set()
    offered: list = []
    service._offer = lambda candidates: offer(candidates) and not queued.extend((c.span.trace_id, c.question, c.answer) for c in candidates) and not conventions.update(c.convention for c in candidates) and not offered.extend(candidates)  # type: ignore[method-assign]
    proxy = RetryProxy(f"http://127.0.0.1:{service.server.http_port}") if processor == "simple" else None
    try:
        calls = run_app(environment, source, processor, proxy.endpoint if proxy else f"http://127.0.0.1:{service.server.http_port}", app_model)
        assert service.flush(60)
        spans = backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= len(CONVERSATIONS), timeout=30)
        assert service.flush(10)
    finally:
        if proxy is not None:
            proxy.close()
        service.stop(10)
    expected = [(trace_id, conversation[-1]["content"], ANSWERS[conversation[-1]["content"]]) for trace_id, conversation in zip(calls, CONVERSATIONS)]
    assert sorted(queued) == sorted(expected), (queued, service.window.outcomes if service.window else None)
    assert conventions == {convention}
    assert sorted(s["trace_id"] for s in evaluator_spans(backend.spans)) == sorted(calls)  # exactly once each
    assert all(s["attributes"]["relevancy.status"] == "scored" for s in evaluator_spans(spans))
    # the conversation reaches the scorer: the follow-up is judged in it, the first turn alone
    judged = {s["trace_id"]: s["attributes"] for s in evaluator_spans(backend.spans)}
    first, follow_up = calls
    assert "relevancy.history.status" not in judged[first], judged[first]
    if source not in NO_HISTORY:
        read = {c.span.trace_id: (c.history, c.span.attributes.get("input.value")) for c in offered}
        assert judged[follow_up].get("relevancy.history.status") == "read" and judged[follow_up]["relevancy.history.turns"] == 2, (source, read.get(follow_up))
        assert judged[follow_up]["relevancy.question.standalone"].startswith("On which river is Lyon?")
    if proxy is not None:
        assert proxy.dropped == 1 and proxy.resent >= 1  # a request `serve` had taken came again
    assert not service.skipped_spans, service.skipped_spans


@pytest.mark.parametrize("processor", ["simple", "batch"])
def test_traceloop_with_content_capture_off_is_counted_as_such_not_held(processor, server, app_model, caplog, no_exports):
    """traceloop-sdk with ``TRACELOOP_TRACE_CONTENT=false``: its workflow spans carry no
    ``traceloop.entity.input`` / ``.output`` and its ``openai.chat`` spans no content (a GenAI
    chat span without content, which would wait for content events that never come and
    expire as ``span_without_content`` after ``join_ttl``). Nothing is scored; each workflow is
    counted skipped as ``content_not_captured``, its chat call is not held (``uncaptured``),
    and the log line names the setting."""
    import logging

    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, decision_wait=30.0), http_port=0, grpc_port=None).start()
    queued: list = []
    offer = service._offer
    service._offer = lambda candidates: offer(candidates) and not queued.extend(candidates)  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
            calls = run_app("traceloop_0_62_4", "traceloop_workflow", processor, f"http://127.0.0.1:{service.server.http_port}", app_model, TRACELOOP_TRACE_CONTENT="false")
            assert service.flush(30)
        assert len(calls) == len(CONVERSATIONS) and not queued and len(service.join) == 0
        assert service.skipped_spans == {("traceloop", "content_not_captured"): len(calls)}
        assert service.window is not None and service.window.outcomes.get("uncaptured") == len(calls)
        logged = [r.getMessage() for r in caplog.records if "yields no question or answer" in r.getMessage()]
        assert len(logged) == 1 and "TRACELOOP_TRACE_CONTENT=false" in logged[0] and "Lyon" not in logged[0]
    finally:
        service.stop(10)


def test_the_docs_source_table_names_every_pinned_source_of_the_matrix():
    """docs/service.md's table of sources tried names the package under test of every matrix
    environment at its pinned version (the first pin of each ``tests/sources/NAME.txt``; the Vercel
    project's ``ai`` and ``@arizeai/openinference-vercel``), so a pin bump without the docs fails."""
    page = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    table = page[page.index("| source | versions tried | read from |"):]
    table = table[: table.index("\n\n")]
    expected = []
    for pins in sorted(SOURCES.glob("*.txt")):
        lines = [line.strip() for line in pins.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("#")]
        expected.append(lines[0])
    dependencies = json.loads((SOURCES / "vercel" / "package.json").read_text(encoding="utf-8"))["dependencies"]
    expected += [f"{name}@{dependencies[name]}" for name in ("ai", "@arizeai/openinference-vercel")]
    assert len(expected) >= 10
    missing = [pin for pin in expected if pin not in table]
    assert not missing, f"docs/service.md's source table lacks {missing}"
