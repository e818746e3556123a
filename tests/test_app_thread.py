"""The app's own thread and process under hostile conditions (issue 35, items 13-15): a fork at
any moment of the first scoring, a 10 MB answer holding a lone surrogate, deep recursion
through the decorator.

Each test fails on the code before its fix (see the commit messages).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from relevancy_tracer_testing import Hang

from .conftest import ROOT, fake_model_env, subprocess_env

# A fresh interpreter (nothing of openai imported yet): configure, then fork at MOMENT; the
# child makes two traced calls and reports their statuses, the parent waits for it.
FORK_APP = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, json, os, sys, threading
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import relevancy_tracer

    moment = sys.argv[1]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    relevancy_tracer.configure(setup_otel=False, method="ragas", llm_timeout=5.0, llm_max_retries=0)

    importing, forked = threading.Event(), threading.Event()

    class Gate(importlib.abc.MetaPathFinder):
        # holds the worker inside `import openai` (openai/__init__ half run, its module lock
        # held) until the main thread has forked: in the execution of openai._client, where the
        # global import lock (which fork takes) is free
        def find_spec(self, name, path=None, target=None):
            if name != "openai._client" or threading.current_thread() is threading.main_thread():
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            execute = spec.loader.exec_module

            def held(module):
                importing.set()
                forked.wait(30)
                execute(module)

            spec.loader.exec_module = held
            return spec

    @relevancy_tracer.trace(name="answer")
    def answer(question):
        return "France is in western Europe and Paris is its capital."

    QUESTION = "Where is France and what is its capital?"
    if moment == "during-import":
        assert "openai" not in sys.modules
        sys.meta_path.insert(0, Gate())
        answer(QUESTION)
        assert importing.wait(60), "the worker never imported openai"
    elif moment == "during-request":
        answer(QUESTION)  # the model server never answers this one
        sys.stdin.readline()  # the test saw the request arrive
    elif moment == "after":
        answer(QUESTION)
        assert relevancy_tracer.flush(30)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            forked.set()  # the gate lets the child's own import of openai through
            exporter.clear()
            answer(QUESTION)
            answer(QUESTION)
            flushed = relevancy_tracer.flush(30)
            statuses = [s.attributes.get("relevancy.status") for s in exporter.get_finished_spans() if s.name == "answer"]
            errors = [s.attributes.get("relevancy.error") for s in exporter.get_finished_spans() if s.name == "answer"]
            os.write(write, json.dumps({"flushed": flushed, "statuses": statuses, "errors": errors}).encode())
        finally:
            os._exit(0)
    forked.set()
    os.close(write)
    os.waitpid(pid, 0)
    print("CHILD", os.read(read, 100000).decode(), flush=True)
    os._exit(0)  # the parent's hung request (during-request) must not hold the exit
    """
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("moment", ["before", "during-import", "during-request", "after"])
def test_a_fork_at_any_moment_of_the_first_scoring_leaves_a_child_that_scores(server, tmp_path, moment):
    # gunicorn --preload forks workers whenever the master is: before, during (the worker thread
    # importing openai, or waiting on the model) or after the first scoring
    if moment == "during-request":
        server.chat.push(Hang())
    script = tmp_path / "app.py"
    script.write_text(FORK_APP)
    proc = subprocess.Popen(
        [sys.executable, str(script), moment],
        cwd=ROOT,
        env=subprocess_env(fake_model_env(server)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if moment == "during-request":
        assert server.wait_for_requests("chat", 1, timeout=60)
        proc.stdin.write("forking\n")
        proc.stdin.flush()
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    child = json.loads([line for line in stdout.splitlines() if line.startswith("CHILD ")][0][6:])
    assert child["flushed"] and child["statuses"] == ["scored", "scored"], child
