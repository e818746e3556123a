"""``relevancy-tracer demo``: the example RAG app, traced into a local Arize Phoenix.

1. Starts ``phoenix serve`` on 127.0.0.1 (``PHOENIX_PORT``, default 4318: Phoenix then receives
   OTLP/HTTP on the standard port; working directory ``./.phoenix``; telemetry off), or reuses
   one already running there. ``--no-phoenix`` exports to ``OTEL_EXPORTER_OTLP_ENDPOINT``.
2. Runs the example RAG app (``examples/rag_app.py``: Python's language reference, retrieval
   with the embedded USE, generation with the embedded Qwen2.5-Coder-1.5B) over questions it
   can and cannot answer; ``relevancy_tracer.trace`` scores each answer in the background.
3. Prints question, answer, score and label as each result arrives, then the label counts and
   the evaluator version (``relevancy.evaluator.version``), checks through Phoenix's REST API that every answer span arrived with its ``relevancy.*`` attributes, and prints the
   Phoenix URLs of the project and of each trace.

Exit status 0 when every answer was scored and found in Phoenix. SIGTERM (what Docker,
systemd and Kubernetes send) and SIGINT stop the demo and the Phoenix server it started: no
child process outlives it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import relevancy_tracer

from ._phoenix_server import PhoenixServer, free_port, port_is_free
from .config import Settings

PROJECT = "relevancy-tracer-demo"
SPAN_NAME = "python_docs_rag.answer"


def _short(text: Optional[str], width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


class ResultTable:
    """Prints one table row per evaluation as results arrive (an ``on_result`` hook)."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.outcomes: list[Any] = []
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def header(self) -> None:
        print(f"{'score':>6}  {'label':<20}  {'why':<10}  {'question':<48}  answer", flush=True)
        print("-" * 120, flush=True)

    def __call__(self, outcome: Any) -> None:
        result = outcome.result
        score = f"{result.score:6.3f}" if result is not None and result.ok else f"{'-':>6}"
        label = result.label if result is not None and result.ok else outcome.status
        why = (result.failure_kind or "") if result is not None and result.ok else ""
        answer = self.answers.get(outcome.question, "")
        with self.done:
            print(f"{score}  {label:<20}  {why:<10}  {_short(outcome.question, 48):<48}  {_short(answer, 60)}", flush=True)
            self.outcomes.append(outcome)
            self.done.notify_all()


    def summary(self) -> str:
        """One line: how many answers got each label, and the failure kinds of the others."""
        scored = [o.result for o in self.outcomes if o.status == "scored" and o.result is not None]
        labels = Counter(r.label for r in scored)
        kinds = Counter(r.failure_kind for r in scored if r.failure_kind)
        parts = [f"{n} {label}" for label, n in sorted(labels.items(), key=lambda item: -item[1])]
        why = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items(), key=lambda item: -item[1]))
        return "Labels: " + ", ".join(parts) + (f" (why: {why})" if why else "") + "."


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler, so ``finally`` blocks stop children."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(args: argparse.Namespace) -> int:
    """Run the demo (arguments: see ``relevancy-tracer demo --help``)."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        return _run(args)
    except (_Terminated, KeyboardInterrupt):
        print("\nStopped.", flush=True)
        return 143 if isinstance(sys.exc_info()[1], _Terminated) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    started: list[PhoenixServer] = []  # servers this run started: stopped whatever happens
    try:
        return _demo(args, started)
    finally:
        for server in started:
            server.stop()
        relevancy_tracer.shutdown(5.0)


def _demo(args: argparse.Namespace, started: list) -> int:
    from ._examples.rag_app import QUESTIONS, PythonReferenceRAG, extractive_generator

    questions = list(QUESTIONS[: args.questions] if args.questions else QUESTIONS)
    server: Optional[PhoenixServer] = None
    started_here = False
    if not args.no_phoenix:
        port = args.phoenix_port or int(os.environ.get("PHOENIX_PORT", "4318"))
        grpc_port = 4317 if port_is_free(4317) else free_port()
        server = PhoenixServer(port, grpc_port, Path(os.environ.get("PHOENIX_WORKING_DIR", ".phoenix")))
        if server.healthy():
            print(f"Using the Phoenix already running at {server.url}", flush=True)
        elif not port_is_free(port):
            print(f"relevancy-tracer demo: port {port} is busy and is not Phoenix; set PHOENIX_PORT", file=sys.stderr)
            return 2
        else:
            print(f"Starting Phoenix at {server.url} (working dir {server.working_dir}, log {server.log_path}) ...", flush=True)
            started_here = True
            started.append(server)  # before start(): a signal during start-up must still stop it
            server.start()
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = server.url
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    os.environ.setdefault("OTEL_SERVICE_NAME", "python-docs-rag")
    resource = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(filter(None, [resource, f"openinference.project.name={PROJECT}"]))
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")  # Phoenix takes traces only
    # With the model host (default) the app's answers and the scorer share one model. In process
    # (local_host=false) the app has its own instance: split the cores between the two.
    if not Settings.resolve().local_host:
        cores = os.cpu_count() or 1
        os.environ.setdefault("RAG_APP_THREADS", str(max(1, cores // 2)))
        os.environ.setdefault("RELEVANCY_TRACER_LOCAL_THREADS", str(max(1, cores - cores // 2)))
    # Local scoring on a small CPU is slower than the app answers: hold answer spans for as long
    # as the backlog needs instead of the production default (60 s).
    os.environ.setdefault("RELEVANCY_TRACER_HOLD_TIMEOUT", "1800")
    os.environ.setdefault("RELEVANCY_TRACER_EVALUATION_TIMEOUT", "600")
    answers: dict = {}
    table = ResultTable(answers)
    settings = relevancy_tracer.configure(on_result=table)
    print(f"Scoring with {settings.resolved_llm_model} + {settings.resolved_embedding_model} (method {settings.method}).", flush=True)
    print("Loading the example RAG app (Python's language reference) ...", flush=True)
    rag = PythonReferenceRAG(generator=extractive_generator if args.extractive else None)
    print(f"Asking {len(questions)} questions; each answer is scored in the background.\n", flush=True)
    table.header()
    began = time.monotonic()
    for question in questions:
        answers[question] = rag.answer(question)["answer"]
    finished = relevancy_tracer.shutdown(timeout=1800)
    elapsed = time.monotonic() - began
    scored = [o for o in table.outcomes if o.status == "scored"]
    print(f"\n{len(scored)} of {len(questions)} answers scored in {elapsed:.0f} s{'' if finished else ' (some evaluations did not finish)'}.", flush=True)
    if scored:
        print(table.summary(), flush=True)
        versions = sorted({o.result.evaluator_version for o in scored if o.result.evaluator_version})
        if versions:  # the evaluator's identity: filter and compare scores by it in Phoenix
            print(f"Evaluator version {', '.join(versions)} (relevancy.evaluator.version on each span).", flush=True)
    ok = len(scored) == len(questions)
    if server is not None:
        # Only this run's traces count: a reused Phoenix (or working dir) keeps earlier runs' spans.
        ours = {o.trace_id for o in scored}

        def scored_here(spans: list) -> list:
            return [x for x in spans if (x.get("context") or {}).get("trace_id") in ours and "relevancy.score" in (x.get("attributes") or {})]

        spans = server.wait_for_spans(PROJECT, lambda s: len(scored_here(s)) >= len(ours), timeout=60, name=[SPAN_NAME])
        in_phoenix = scored_here(spans)
        print(f"Phoenix has {len(in_phoenix)} of this run's answer spans with relevancy attributes. Open:", flush=True)
        print(f"  project: {server.project_url(PROJECT)}", flush=True)
        for outcome in table.outcomes:
            print(f"  {_short(outcome.question, 48):<48}  {server.trace_url(outcome.trace_id)}", flush=True)
        ok = ok and len(in_phoenix) == len(ours)
        if started_here and args.keep_running:
            print(f"\nPhoenix keeps running at {server.url}; press Ctrl-C to stop it.", flush=True)
            signal.pause() if hasattr(signal, "pause") else time.sleep(10**9)
    return 0 if ok else 1

