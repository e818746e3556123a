"""The model host (issue 26): the local models run in one process per user and model set; the
app survives it, every process shares it, and it never outlives its clients.

These tests run the host with the scripted models of :mod:`relevancy_tracer_testing`
(``FakeHostChatModel`` / ``FakeHostEmbedder``, registered in this process and in the hosts it
starts by ``use_scripted_host_models``, not by a setting) instead of llama.cpp: the host, its sockets,
lock file, supervision and restarts are the real ones. ``test_local_models.py`` runs the real
model through the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import relevancy_tracer
from relevancy_tracer.tracing import lifecycle
from relevancy_tracer.config import Settings
from relevancy_tracer.scoring.backends import build_models, host_connection
from relevancy_tracer.models.host import HostConnection, ModelHostError
from relevancy_tracer.otel import attributes as A
from relevancy_tracer_testing import HOLD_FILE_ENV, use_scripted_host_models

from .conftest import ROOT, finished_spans, subprocess_env

FAKE = dict(
    llm="local",
    embeddings="local",
    llm_model="fake-host-chat",
    embedding_model="fake-host-embed",
    local_host_idle_timeout=1.0,
    calibration="none",
)
FAKE_ENV = {"RELEVANCY_TRACER_" + k.upper(): str(v) for k, v in FAKE.items()}
FAKE_ENV["PYTHONPATH"] = str(ROOT)  # the client scripts import relevancy_tracer_testing
use_scripted_host_models()
QUESTION = "Where is France and what is its capital?"
ANSWER = "France is in western Europe and Paris is its capital."


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache directory (and so a private host) for the test."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("RELEVANCY_TRACER_CACHE_DIR", str(directory))
    return directory


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# a model set of its own (local_context), so the test starts and kills its own host, not one
# another process of this user shares
REAL = dict(llm="local", embeddings="local", llm_model="qwen2.5-coder-1.5b", embedding_model="use-multilingual-v3", local_host_idle_timeout=1.0, local_context=4096)


@pytest.mark.parametrize(
    "signum, models",
    [(signal.SIGKILL, "scripted"), (signal.SIGSEGV, "scripted"), pytest.param(signal.SIGKILL, "real", marks=pytest.mark.local_models)],
)
def test_host_crash_fails_only_its_in_flight_evaluations(request, tracing, otel, tmp_path, monkeypatch, signum, models):
    """SIGKILL / SIGSEGV of the host while 4 evaluations are in flight and the app keeps
    calling: every app call returns normally, the 4 end with status error /
    ``model_host_crashed``, and evaluations after the restart are scored. ``scripted`` holds
    the requests in the host until the kill; ``real`` kills the real model mid-decoding."""
    hold = tmp_path / "hold"
    if models == "real":  # the user's cache directory: the assembled model file is there
        tracing(**REAL, concurrency=4, evaluation_timeout=600, hold_timeout=600)
    else:
        request.getfixturevalue("cache")
        hold.touch()
        monkeypatch.setenv(HOLD_FILE_ENV, str(hold))
        tracing(**FAKE, concurrency=4)

    @relevancy_tracer.trace(name="in_flight")
    def in_flight(question):
        return ANSWER

    @relevancy_tracer.trace(name="after_crash")
    def after_crash(question):
        return ANSWER

    assert [in_flight(QUESTION) for _ in range(4)] == [ANSWER] * 4
    connection = host_connection(lifecycle.current().settings)
    wait_until(lambda: connection.info()["in_flight"] == 4, timeout=300, what="4 requests in flight in the host")
    host_pid = connection.info()["pid"]
    os.kill(host_pid, signum)
    assert [after_crash(QUESTION) for _ in range(3)] == [ANSWER] * 3  # the app keeps calling
    wait_until(lambda: len(finished_spans(otel, "in_flight")) == 4, what="the in-flight evaluations to fail")
    if hold.exists():
        hold.unlink()
    assert relevancy_tracer.flush(600)

    crashed = [dict(s.attributes) for s in finished_spans(otel, "in_flight")]
    assert [(a[A.STATUS], a[A.ERROR_TYPE]) for a in crashed] == [("error", "model_host_crashed")] * 4
    name = signal.Signals(signum).name
    assert all(f"killed by {name}" in str(s.status.description) + str(s.attributes) for s in finished_spans(otel, "in_flight")), crashed
    later = [dict(s.attributes) for s in finished_spans(otel, "after_crash")]
    assert [a[A.STATUS] for a in later] == ["scored"] * 3
    assert connection.info()["pid"] != host_pid and connection.starts == 2
    if signum == signal.SIGSEGV:  # the native crash is named in the host's log
        assert "Segmentation fault" in connection.paths.log.read_text(errors="replace")


def test_restarts_are_bounded_then_every_evaluation_names_the_crash(cache):
    """A host that keeps dying is restarted with backoff a bounded number of times; after that
    each request fails at once with ModelHostError (status ``model_host_crashed``), never a hang."""
    settings = Settings.resolve(**FAKE)
    from relevancy_tracer.models.host import HostChatModel

    connection = HostConnection(host_connection(settings).spec, max_restarts=2, restart_window=600)
    model = HostChatModel(connection)
    import asyncio

    messages = [{"role": "user", "content": f"<answer>\n{ANSWER}\n</answer>"}]
    for _ in range(2):  # a crash between requests: the next request restarts the host
        asyncio.run(model.chat_json(messages, {}, max_tokens=8))
        pid = connection.info()["pid"]
        os.kill(pid, signal.SIGKILL)
        connection._process.wait(10)  # all its threads gone (a zombie leader may still hold its sockets)
    started = time.monotonic()
    with pytest.raises(ModelHostError, match="crashed 2 times .*killed by SIGKILL") as failure:
        asyncio.run(model.chat_json(messages, {}, max_tokens=8))
    assert failure.value.status == "model_host_crashed" and time.monotonic() - started < 5
    assert connection.starts == 2


CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import relevancy_tracer_testing
    relevancy_tracer_testing.use_scripted_host_models()
    from relevancy_tracer.config import Settings
    from relevancy_tracer.scoring.backends import build_models
    models = build_models(Settings.resolve())
    start = float(sys.argv[1])
    while time.time() < start:  # start together
        time.sleep(0.001)
    reply = asyncio.run(models.llm.chat_json([{"role": "user", "content": "hi"}], {}, max_tokens=4))
    info = models.llm.connection.info()
    print(json.dumps({"pid": info["pid"], "starts": models.llm.connection.starts, "llama": "llama_cpp" in sys.modules}), flush=True)
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
    """
)


def test_two_processes_starting_at_once_end_up_with_one_host(cache, tmp_path):
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = subprocess_env(FAKE_ENV, RELEVANCY_TRACER_CACHE_DIR=str(cache))
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, str(script), str(start)], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert len({r["pid"] for r in results}) == 1, results
    assert sum(r["starts"] for r in results) == 1 and not any(r["llama"] for r in results)


def test_host_exits_after_its_last_client_is_sigkilled(cache, tmp_path):
    """No orphan: the presence connection closes when the client dies, however it dies, and
    the host exits after its idle timeout."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = subprocess_env(FAKE_ENV, RELEVANCY_TRACER_CACHE_DIR=str(cache))
    client = subprocess.Popen([sys.executable, str(script), "0", "600"], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    host_pid = json.loads(client.stdout.readline())["pid"]
    host = psutil.Process(host_pid)
    assert host.nice() == 19  # below the app's priority
    client.kill()
    client.wait()
    started = time.monotonic()
    wait_until(lambda: gone(host_pid), timeout=20, what="the host to exit")
    assert time.monotonic() - started < 15
    assert not any(p.suffix in (".sock", ".clients") for p in (cache / "hosts").iterdir())


FORKED = textwrap.dedent(
    """
    import json, os, sys
    import relevancy_tracer, relevancy_tracer_testing
    relevancy_tracer_testing.use_scripted_host_models()
    from relevancy_tracer.tracing import lifecycle
    from relevancy_tracer.scoring.backends import host_connection

    results, errors = [], []
    def on_result(outcome):
        results.append(outcome.status)
        errors.append(outcome.result.error if outcome.result is not None else None)
    relevancy_tracer.configure(setup_otel=False, score_unrecorded=True, on_result=on_result)

    @relevancy_tracer.trace(name="forked")
    def answer(question):
        return "France is in western Europe and Paris is its capital."

    answer("Where is France?")
    assert relevancy_tracer.flush(30)
    connection = host_connection(lifecycle.current().settings)
    parent_host = connection.info()["pid"]
    children = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                answer("Where is France?")
                ok = relevancy_tracer.flush(30)
                out = {"ok": ok, "statuses": results, "host": connection.info()["pid"], "starts": connection.starts, "llama": "llama_cpp" in sys.modules}
                os.write(write, json.dumps(out).encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    outs = []
    for pid, read in children:
        os.waitpid(pid, 0)
        outs.append(json.loads(os.read(read, 100000)))
    print(json.dumps({"parent_host": parent_host, "parent_statuses": results, "errors": errors, "children": outs, "llama": "llama_cpp" in sys.modules}))
    """
)


def test_forked_workers_reconnect_to_the_one_host(cache, tmp_path):
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    env = subprocess_env(FAKE_ENV, RELEVANCY_TRACER_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["parent_statuses"] == ["scored"] and not out["llama"], out
    for child in out["children"]:
        # the child's first evaluation went to the parent's host: a reconnect, no second host
        assert child["ok"] and child["statuses"][-1] == "scored" and child["host"] == out["parent_host"]
        assert child["starts"] == 0 and not child["llama"]


def test_configuring_the_local_default_loads_nothing_in_the_app(cache):
    """With the local default, configuring the tracer and building its backends imports no
    llama.cpp and starts no host (the host starts on the first evaluation)."""
    code = textwrap.dedent(
        """
        import sys, relevancy_tracer
        from relevancy_tracer.tracing import lifecycle
        settings = relevancy_tracer.configure(llm="local", embeddings="local", setup_otel=False)
        models = lifecycle.current().engine.models
        print(type(models.llm).__name__, type(models.embedder).__name__, "llama_cpp" in sys.modules, models.llm.connection.starts)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(RELEVANCY_TRACER_CACHE_DIR=str(cache)), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["HostChatModel", "HostEmbedder", "False", "0"], done.stderr[-2000:]


def test_in_process_fallback_and_same_evaluator_identity(cache):
    """``local_host=false`` runs the models in this process (debugging); both paths report the
    same model name and decoding, so the evaluator version and the calibration are the same."""
    from relevancy_tracer.models.local_llm import LocalChatModel
    from relevancy_tracer.scoring.engine import Engine

    hosted = Settings.resolve(llm="local", embeddings="local")
    inline = hosted.replace(local_host=False)
    hosted_models, inline_models = build_models(hosted), build_models(inline)
    assert isinstance(inline_models.llm, LocalChatModel)
    assert (hosted_models.llm.name, hosted_models.llm.decoding, hosted_models.embedder.name) == (inline_models.llm.name, inline_models.llm.decoding, inline_models.embedder.name)
    engine = Engine(hosted)
    assert engine.identity(hosted, hosted_models) == engine.identity(inline, inline_models)


def test_host_files_are_private(cache):
    settings = Settings.resolve(**FAKE)
    import asyncio

    models = build_models(settings)
    vectors = asyncio.run(models.embedder.embed(["a b", "c d"])).vectors
    assert vectors.shape == (2, 64)
    paths = models.llm.connection.paths
    assert oct(paths.socket.parent.stat().st_mode & 0o777) == "0o700"
    assert oct(paths.socket.stat().st_mode & 0o777) == "0o600" and oct(paths.clients.stat().st_mode & 0o777) == "0o600"
    info = models.llm.connection.info()
    assert info["nice"] >= 19 - os.getpriority(os.PRIO_PROCESS, 0) and info["clients"] >= 1
    autogroup = Path(f"/proc/{info['pid']}/autogroup")
    if autogroup.exists():  # the host's session is scheduled at low priority too (sched(7))
        assert autogroup.read_text().split()[-1] == "19"
    models.llm.connection.close()


@pytest.mark.parametrize("nice, policy", [(19, "SCHED_IDLE"), (10, "SCHED_OTHER")])
def test_host_threads_run_under_sched_idle_at_nice_19(cache, nice, policy):
    """``local_host_nice`` 19 (the default) also puts the host under SCHED_IDLE; every thread
    has the policy and the niceness: those started at import (OpenBLAS's pool) and those
    started later (the executor's, the model's). A lower niceness sets the niceness alone."""
    models = build_models(Settings.resolve(**FAKE, local_host_nice=nice))
    assert models.llm.generate([{"role": "user", "content": "hi"}]) == "generated: hi"  # runs in a thread of the host's executor
    info = models.llm.connection.info()
    assert info["policy"] == policy
    host = psutil.Process(info["pid"])
    threads = [t.id for t in host.threads()]
    assert len(threads) > 1  # the executor's threads started after the policy was set
    names = {os.SCHED_IDLE: "SCHED_IDLE", os.SCHED_OTHER: "SCHED_OTHER"}
    assert {names.get(os.sched_getscheduler(tid)) for tid in threads} == {policy}
    assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)}
    models.llm.connection.close()


def test_a_cancelled_request_is_cancelled_in_the_host_and_is_no_crash(cache, tmp_path, monkeypatch):
    """An evaluation that times out closes its connection: the host cancels that request, and
    the client neither counts a crash nor restarts the host."""
    import asyncio

    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv(HOLD_FILE_ENV, str(hold))
    models = build_models(Settings.resolve(**FAKE))
    connection = models.llm.connection
    messages = [{"role": "user", "content": f"<answer>\n{ANSWER}\n</answer>"}]
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(asyncio.wait_for(models.llm.chat_json(messages, {}, max_tokens=8), 1.0))
    pid = connection.info()["pid"]
    wait_until(lambda: connection.info()["in_flight"] == 0, what="the host to cancel the request")
    hold.unlink()
    reply = asyncio.run(models.llm.chat_json(messages, {}, max_tokens=8))
    assert reply.model == "fake-host-chat" and connection.info()["pid"] == pid
    assert connection.starts == 1 and not connection._crashes


def test_a_request_cancelled_before_it_connects_is_never_sent(cache, tmp_path, monkeypatch):
    """A caller cancelled before its worker thread has connected (a loaded machine schedules that
    thread late) gets ModelError at once; the request never reaches the host, where it would
    hold the thread for as long as the model takes (here: forever)."""
    from concurrent.futures import ThreadPoolExecutor

    from relevancy_tracer.models.base import ModelError
    from relevancy_tracer.models.host_client import _Call

    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv(HOLD_FILE_ENV, str(hold))
    connection = build_models(Settings.resolve(**FAKE)).llm.connection
    served = connection.info()["served"]
    call = _Call()
    call.cancel()
    payload = {"messages": [{"role": "user", "content": "hi"}], "schema": {}, "max_tokens": 8}
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(connection.request, "/chat", payload, call)
        try:
            with pytest.raises(ModelError, match="cancelled"):
                sent.result(timeout=20)
        finally:
            hold.unlink()  # lets a request that did reach the host finish
    info = connection.info()
    assert info["served"] == served and info["in_flight"] == 0  # the host never saw it
    connection.close()


def test_a_module_function_model_name_is_refused_and_never_imported(cache, tmp_path):
    """``llm_model`` / ``embedding_model`` name models, never code: ``RELEVANCY_TRACER_LLM_MODEL=
    os:system`` (or any ``module:function``) starts no model host and imports nothing; every
    local evaluation fails with an error naming the setting and the models there are, and the
    host run by hand refuses it too. A module on the path that records its import shows it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ndef make():\n    raise SystemExit(9)\n")
    code = textwrap.dedent(
        """
        import json, relevancy_tracer
        from relevancy_tracer.scoring.backends import host_connection
        from relevancy_tracer.tracing import lifecycle
        settings = relevancy_tracer.configure(setup_otel=False)
        result = relevancy_tracer.score("Where is France?", "France is in western Europe.")
        print(json.dumps({"status": str(result.status), "error": result.error, "starts": host_connection(settings).starts}))
        """
    )
    for llm_model, embedding_model in (("os:system", None), ("planted:make", None), (None, "planted:make")):
        env = subprocess_env(RELEVANCY_TRACER_CACHE_DIR=str(cache), RELEVANCY_TRACER_LLM="local", RELEVANCY_TRACER_EMBEDDINGS="local", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
        env.update({"RELEVANCY_TRACER_LLM_MODEL": llm_model} if llm_model else {"RELEVANCY_TRACER_EMBEDDING_MODEL": embedding_model})
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        setting, name = ("llm_model", llm_model) if llm_model else ("embedding_model", embedding_model)
        assert out["status"] == "model_error" and out["starts"] == 0, out
        assert f"{setting} {name!r} is not a local model" in out["error"] and "never imported" in out["error"], out
        assert f"{setting} {name!r} is not a local model" in done.stderr  # said once at configure time
        assert not marker.exists()
    by_hand = subprocess.run(
        [sys.executable, "-m", "relevancy_tracer.models.host", "--directory", str(tmp_path / "hosts"), "--llm", "planted:make"],
        env=subprocess_env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)])), cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert by_hand.returncode == 2 and "llm_model 'planted:make' is not a local model" in by_hand.stderr, by_hand.stderr[-2000:]
    assert not marker.exists() and "Traceback" not in by_hand.stderr
