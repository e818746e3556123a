"""The fleet's fault suite (issue 22): the scoring fleet never loops, never stalls, loses nothing.

Real components on 127.0.0.1: redis-server (restarted empty on its port for one test), the
scripted OpenAI-compatible server (slow, failing, recovering), the OTLP receiver standing in
for the tracing backend, where EVALUATOR spans are counted. Workers run in threads of this
process (FleetWorker, as ``relevancy-tracer worker`` runs it) with short claim times. Every
test accounts for every job it queued: scored exactly once (one EVALUATOR span) or
dead-lettered with a reason. Waits poll Redis and the backend with a deadline, never sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from relevancy_tracer.otel import attributes as A
from relevancy_tracer.otel.results import evaluation_id
from relevancy_tracer.service.jobs import ScoreRequest
from relevancy_tracer_testing import Gate, RedisServer, Status

from ._observability import wait_until
from .conftest import ROOT, fake_model_env, openai_settings, subprocess_env
from .test_service import backend, evaluator_spans  # noqa: F401 - the backend fixture

STREAM = "relevancy-tracer:evaluations"
DEAD_LETTER = STREAM + ":dead-letter"


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    with RedisServer(str(tmp_path)) as server:
        yield server


@pytest.fixture
def client(redis_server):
    import redis

    connection = redis.Redis.from_url(redis_server.url)
    yield connection
    connection.close()


def job(i: int, run: str = "fleet-fault") -> ScoreRequest:
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return ScoreRequest(evaluation_id(trace_id, span_id, "ragas"), trace_id, span_id, run, "fault-app", f"Where is city number {i}?", f"City number {i} is in France.", "ragas")


def enqueue(client: Any, payloads: list) -> None:
    """XADD each payload (a ScoreRequest, a dict serialised as is, or raw bytes) as the
    receiver does."""
    for payload in payloads:
        if isinstance(payload, ScoreRequest):
            payload = payload.to_json()
        elif isinstance(payload, dict):
            payload = json.dumps(payload)
        client.xadd(STREAM, {"job": payload})


def dead_letters(client: Any) -> list[dict]:
    return [{k.decode(): v.decode(errors="replace") for k, v in fields.items()} for _, fields in client.xrange(DEAD_LETTER)]


@contextlib.contextmanager
def workers(redis_url: str, settings: Any, n: int = 1, claim_idle: float = 0.4) -> Iterator[list]:
    """``n`` FleetWorkers consuming in threads; stopped (jobs in hand finished) on exit."""
    from relevancy_tracer.service import FleetWorker

    fleet = [FleetWorker(redis_url, settings, claim_idle=claim_idle, consumer=f"worker-{i}") for i in range(n)]
    threads = [threading.Thread(target=w.run, name=f"fleet-worker-{i}", daemon=True) for i, w in enumerate(fleet)]
    for thread in threads:
        thread.start()
    try:
        yield fleet
    finally:
        for worker in fleet:
            worker.stop()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a worker did not stop"


def settled(client: Any, dead: int = 0) -> bool:
    """Nothing left on the job stream (every job acknowledged) and ``dead`` dead letters."""
    return client.xlen(STREAM) == 0 and client.xlen(DEAD_LETTER) == dead


def evaluations_by_id(backend, expected: int) -> dict[str, list[dict]]:
    """The backend's EVALUATOR spans by evaluation id, once ``expected`` arrived."""
    spans = evaluator_spans(backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= expected, timeout=30))
    out: dict[str, list[dict]] = {}
    for span in spans:
        out.setdefault(span["attributes"][A.EVALUATION_ID], []).append(span)
    return out


# ------------------------------------------------------------------------------ poison jobs


def test_poison_jobs_are_dead_lettered_at_once_and_never_block_good_ones(server, backend, redis_server, client):
    good = [job(0), job(1)]
    poison = [
        dict(json.loads(job(2).to_json()), question=123),  # non-string question
        dict(json.loads(job(3).to_json()), trace_id="not-hex-at-all"),  # bad trace id
        dict(json.loads(job(4).to_json()), evaluation_id=5),  # non-string evaluation id
        b"{not json \xff",  # undecodable
    ]
    enqueue(client, [good[0], *poison, good[1]])  # all six read in one batch
    settings = openai_settings(server, concurrency=8, max_deliveries=3)
    with workers(redis_server.url, settings) as (worker,):
        wait_until(lambda: settled(client, dead=4), 30, "good jobs scored, poison dead-lettered")
    letters = dead_letters(client)
    reasons = sorted(letter["error"] for letter in letters)
    assert any("question must be a string" in r for r in reasons), reasons
    assert any("trace_id must be 32 hex digits" in r for r in reasons), reasons
    assert any("evaluation_id must be 32 hex digits" in r for r in reasons), reasons
    assert any("not JSON" in r for r in reasons), reasons
    assert all(letter["deliveries"] == "1" for letter in letters)  # no redelivery loop
    assert worker.scored == 2 and worker.dead_lettered == 4 and worker.retried == 0
    assert len(server.requests_to("chat")) == 2  # the poison was never scored
    by_id = evaluations_by_id(backend, 2)
    assert {r.evaluation_id for r in good} == set(by_id) and all(len(v) == 1 for v in by_id.values())
    assert all(v[0]["attributes"][A.STATUS] == "scored" for v in by_id.values())


def test_a_job_its_workers_never_acknowledge_is_dead_lettered_after_max_deliveries(server, backend, redis_server, client):
    """A job whose workers keep dying on it (OOM, kill -9): a consumer that takes it and never
    acknowledges stands in for them; after max_deliveries deliveries it is a dead letter."""
    stuck, fine = job(0), job(1)
    enqueue(client, [stuck])
    client.xgroup_create(STREAM, "relevancy-tracer-workers", id="0")
    entry_id = client.xreadgroup("relevancy-tracer-workers", "dying-worker", {STREAM: ">"}, count=1)[0][1][0][0]
    for _ in range(2):  # two more deliveries to workers that died
        client.xclaim(STREAM, "relevancy-tracer-workers", "dying-worker", 0, [entry_id])
    enqueue(client, [fine])
    with workers(redis_server.url, openai_settings(server, max_deliveries=3), claim_idle=0.2) as (worker,):
        wait_until(lambda: settled(client, dead=1), 30, "the unacknowledged job dead-lettered")
    (letter,) = dead_letters(client)
    assert letter["entry_id"] == entry_id.decode() and letter["deliveries"] == "4"
    assert "not acknowledged after 3 deliveries" in letter["error"] and json.loads(letter["job"])["evaluation_id"] == stuck.evaluation_id
    assert worker.scored == 1 and list(evaluations_by_id(backend, 1)) == [fine.evaluation_id]


# ------------------------------------------------------------------------------ Redis and workers


def test_redis_restarted_empty_while_a_worker_runs(server, backend, redis_server, client):
    from relevancy_tracer.service.queue import DONE_PREFIX, RedisStreamQueue

    producer = RedisStreamQueue(redis_server.url)  # the receiver's queue, created before the restart
    before, after = job(0), job(1)
    with workers(redis_server.url, openai_settings(server)) as (worker,):
        assert producer.offer([before])
        wait_until(lambda: client.exists(DONE_PREFIX + before.evaluation_id), 30, "the first job done")
        redis_server.restart()  # empty: no stream, no consumer group, no done records
        wait_until(lambda: _offered(producer, after), 30, "the receiver queueing again")  # XADD recreates the stream, not the group
        wait_until(lambda: client.exists(DONE_PREFIX + after.evaluation_id), 30, "the job queued after the restart done")
    producer.close()
    assert worker.scored == 2 and worker.queue.groups_created >= 1 and settled(client)
    by_id = evaluations_by_id(backend, 2)
    assert set(by_id) == {before.evaluation_id, after.evaluation_id} and all(len(v) == 1 for v in by_id.values())


def test_redis_at_maxmemory_loses_nothing_and_scores_nothing_twice(server, backend, redis_server, client, caplog):
    """Issue 35, item 6: Redis at ``maxmemory`` refuses every MULTI, SET and XADD. The worker
    still acknowledges each scored job (XACK + XDEL, allowed and freeing memory; the done
    marker skipped): 3 jobs, 3 model calls, 3 EVALUATOR spans. The poison job it cannot move
    to the dead-letter stream stays pending, is retried, and is moved once memory frees."""
    import logging

    jobs = [job(i) for i in range(3)]
    poison = dict(json.loads(job(3).to_json()), question=123)
    enqueue(client, [*jobs, poison])
    client.xgroup_create(STREAM, "relevancy-tracer-workers", id="0")
    client.config_set("maxmemory", "1")  # every write that may grow memory is refused from now on
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        with workers(redis_server.url, openai_settings(server), claim_idle=0.2) as (worker,):
            wait_until(lambda: worker.scored == 3 and client.xlen(STREAM) == 1, 30, "the 3 jobs scored and acknowledged at maxmemory")
            assert client.xlen(DEAD_LETTER) == 0 and worker.dead_lettered == 0
            wait_until(lambda: _all_delivered(client, 1, 2), 30, "the poison job retried")
            client.config_set("maxmemory", "0")
            wait_until(lambda: settled(client, dead=1), 30, "the poison job dead-lettered once memory freed")
    assert worker.scored == 3 and worker.dead_lettered == 1
    assert len(server.requests_to("chat")) == 3  # each job evaluated once
    by_id = evaluations_by_id(backend, 3)
    assert set(by_id) == {j.evaluation_id for j in jobs} and all(len(v) == 1 for v in by_id.values())
    assert "Redis is out of memory" in caplog.text and "acknowledged without its done marker" in caplog.text and "stays pending" in caplog.text
    assert not _redis_tracebacks(caplog)


def test_a_worker_started_while_redis_is_full_waits_and_then_consumes(server, backend, redis_server, client, caplog):
    """Issue 35, item 6: a worker (and ``serve --queue``) started while Redis is at
    ``maxmemory`` and the consumer group does not exist yet (XGROUP CREATE refused) starts,
    says why it waits, retries, and consumes once memory frees; ``serve`` refuses exports
    (retryable) meanwhile, its log quoting no job text."""
    import logging

    from relevancy_tracer.service import ScoringService

    pending = job(0)
    enqueue(client, [pending])  # the stream exists, its group does not
    client.config_set("maxmemory", "1")
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        service = ScoringService(openai_settings(server), queue_url=redis_server.url, http_port=None, grpc_port=None)  # no exception
        try:
            assert not service.accept(_shared_retriever_request(2, "A secret document.")).accepted
        finally:
            service.stop(5)
        assert "secret" not in caplog.text and "Where is city" not in caplog.text
        with workers(redis_server.url, openai_settings(server), claim_idle=0.2) as (worker,):
            wait_until(lambda: "retrying in" in caplog.text, 30, "the worker to retry")
            client.config_set("maxmemory", "0")
            wait_until(lambda: settled(client), 30, "the job scored once memory freed")
    assert worker.scored == 1 and list(evaluations_by_id(backend, 1)) == [pending.evaluation_id]
    assert "Redis is out of memory" in caplog.text and not _redis_tracebacks(caplog)


def _redis_tracebacks(caplog: Any) -> list[str]:
    """The worker's and the queue's log records about Redis that carry a traceback."""
    words = ("Redis", "step failed", "acknowledg", "dead-letter", "consumer group")
    return [r.getMessage() for r in caplog.records if r.exc_info and any(w in r.getMessage() for w in words)]


def _offered(producer: Any, request: ScoreRequest) -> bool:
    try:
        return producer.offer([request])
    except Exception:  # the client reconnects on the next command
        return False


def test_two_workers_against_a_slow_model_never_score_a_job_twice(server, backend, redis_server, client):
    """Each evaluation takes several claim periods; the workers extend their claims, so no
    job is reclaimed by the other one."""
    server.chat_delay = 1.5  # > 3 claim periods of 0.4 s
    jobs = [job(i) for i in range(4)]
    enqueue(client, jobs)
    settings = openai_settings(server, concurrency=2, llm_timeout=10.0)
    try:
        with workers(redis_server.url, settings, n=2, claim_idle=0.4) as fleet:
            wait_until(lambda: settled(client), 60, "all jobs acknowledged")
    finally:
        server.chat_delay = 0.0
    assert sum(w.scored for w in fleet) == 4 and sum(w.reclaimed for w in fleet) == 0
    assert len(server.requests_to("chat")) == 4  # each job evaluated once
    by_id = evaluations_by_id(backend, 4)
    assert set(by_id) == {j.evaluation_id for j in jobs} and all(len(v) == 1 for v in by_id.values())


# ------------------------------------------------------------------------------ model outage


def test_model_outage_jobs_retried_with_backoff_then_scored_final_only_after_max_deliveries(server, backend, redis_server, client):
    outage = [Status(503, "model overloaded")] * 10_000
    server.chat.push(*outage)
    jobs = [job(i) for i in range(3)]
    enqueue(client, jobs)
    settings = openai_settings(server, llm_max_retries=0, max_deliveries=4)
    with workers(redis_server.url, settings, claim_idle=0.5) as (worker,):
        # every job failed twice and waits pending (redelivered after 0.5 s, then 1 s, 2 s)
        wait_until(lambda: _all_delivered(client, 3, 2), 30, "each job delivered twice during the outage")
        assert client.xlen(DEAD_LETTER) == 0
        server.chat.clear()  # the model recovers
        wait_until(lambda: settled(client), 30, "the jobs scored after the recovery")
        assert worker.scored == 3 and worker.retried >= 6 and worker.dead_lettered == 0
        # a longer outage: final after max_deliveries (4) failures, not before
        server.chat.push(*outage)
        chat_before = len(server.requests_to("chat"))
        doomed = job(9)
        enqueue(client, [doomed])
        wait_until(lambda: settled(client, dead=1), 30, "the job dead-lettered after 4 deliveries")
        server.chat.clear()
    (letter,) = dead_letters(client)
    assert letter["deliveries"] == "4" and "model_error on delivery 4 of 4" in letter["error"]
    assert json.loads(letter["job"])["evaluation_id"] == doomed.evaluation_id
    assert len(server.requests_to("chat")) - chat_before == 4  # one evaluation per delivery
    by_id = evaluations_by_id(backend, 4)
    assert set(by_id) == {j.evaluation_id for j in jobs} | {doomed.evaluation_id} and all(len(v) == 1 for v in by_id.values())
    assert all(by_id[j.evaluation_id][0]["attributes"][A.STATUS] == "scored" for j in jobs)
    final = by_id[doomed.evaluation_id][0]["attributes"]  # the final failure is visible on its span
    assert final[A.STATUS] == "error" and final[A.ERROR_TYPE] == "model_error"


def _all_delivered(client: Any, jobs: int, times: int) -> bool:
    try:
        pending = client.xpending_range(STREAM, "relevancy-tracer-workers", "-", "+", 100)
    except Exception:
        return False
    return len(pending) == jobs and all(p["times_delivered"] >= times and p["time_since_delivered"] > 0 for p in pending)


# ------------------------------------------------------------------------------ credentials and listeners


def test_credentials_in_urls_are_masked_in_every_log_line(server, tmp_path, redis_server, client, caplog):
    import logging

    import relevancy_tracer
    from relevancy_tracer._logging import mask_credentials

    assert mask_credentials("http://user:pa55@host/v1 and redis://:pa55@h:6379/0?token=pa55") == "http://***@host/v1 and redis://***@h:6379/0?token=***"
    secret_url = server.base_url.replace("http://", "http://user:pa55@")
    with caplog.at_level(logging.INFO, logger="relevancy_tracer"):
        relevancy_tracer.configure(llm="openai", embeddings="openai", llm_base_url=secret_url, method="ragas", setup_otel=False)
        logging.getLogger("relevancy_tracer").warning("request to %s failed", secret_url)
        relevancy_tracer.shutdown(5)
    assert "pa55" not in caplog.text and "http://***@127.0.0.1" in caplog.text
    # the worker command: its start-up line and the HTTP client's request lines (INFO)
    enqueue(client, [job(0)])
    client.config_set("requirepass", "pa55")  # connections already open stay authenticated
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_LLM_BASE_URL=secret_url, RELEVANCY_TRACER_METHOD="ragas", OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "worker", "--queue", redis_server.url.replace("redis://", "redis://:pa55@"), "--max-jobs", "1"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "1 scored" in output and "POST http://***@127.0.0.1" in output and "redis://***@127.0.0.1" in output
    assert "pa55" not in output


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PROMETHEUS_APP = textwrap.dedent(
    """
    import socket, sys, urllib.request
    import relevancy_tracer
    port = int(sys.argv[1])
    relevancy_tracer.configure()
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).status
    relevancy_tracer.shutdown(5)
    with socket.socket() as sock:
        refused = sock.connect_ex(("127.0.0.1", port)) != 0
    with socket.socket() as sock:  # free: a server can listen on it again (as servers do, SO_REUSEADDR)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1)
    print("PROMETHEUS", scraped, refused, flush=True)
    """
)


def test_the_tracers_shutdown_closes_the_prometheus_listener(server, tmp_path):
    port = _free_port()
    script = tmp_path / "app.py"
    script.write_text(PROMETHEUS_APP)
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_METHOD="ragas", OTEL_METRICS_EXPORTER="prometheus", OTEL_TRACES_EXPORTER="none", OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1", OTEL_EXPORTER_PROMETHEUS_PORT=str(port))
    proc = subprocess.run([sys.executable, str(script), str(port)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PROMETHEUS 200 True" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_the_services_stop_closes_the_prometheus_listener(server, monkeypatch):
    from relevancy_tracer.service import ScoringService

    port = _free_port()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    service = ScoringService(openai_settings(server), http_port=0, grpc_port=None).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200 and b"relevancy" in reply.read()
    finally:
        assert service.stop(10)
    assert not _listening(port)
    with socket.socket() as sock:  # free: a server can listen on it again (as servers do, SO_REUSEADDR)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1)


# ------------------------------------------------------------------------------ job validation

_JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@hypothesis_settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(["evaluation_id", "trace_id", "span_id", "span_name", "service_name", "question", "answer", "method", "contexts", "project", "received_ns", "extra"]), _JSON_VALUES, max_size=4), dropped=st.sets(st.sampled_from(["evaluation_id", "trace_id", "question", "contexts"]), max_size=2))
def test_a_queued_job_is_either_valid_or_rejected_with_a_reason(changes, dropped):
    """Whatever a job's fields hold, reading it raises ValueError (-> a dead letter with the
    reason) or gives a request the worker can score and write: nothing else escapes."""
    data = dict(json.loads(job(0).to_json()), **changes)
    for name in dropped:
        data.pop(name, None)
    try:
        request = ScoreRequest.from_json(json.dumps(data))
    except ValueError as exc:
        assert str(exc)
        return
    assert all(isinstance(getattr(request, name), str) for name in ("question", "answer", "span_name", "service_name", "method"))
    int(request.trace_id, 16), int(request.span_id, 16), int(request.evaluation_id, 16)
    assert ScoreRequest.from_json(request.to_json()) == request


# ------------------------------------------------------------------------------ shutdown (issue 35, item 9)


def test_sigterm_while_requests_wait_on_a_stalled_redis_answers_them_and_exits_cleanly(server, backend, redis_server, tmp_path):
    """SIGTERM while an HTTP and a gRPC export wait on a Redis that stopped answering
    (SIGSTOP): both get a retryable answer (503 with Retry-After / UNAVAILABLE), serve exits 0
    well inside Kubernetes' 30 s grace, and logs no traceback ("Task was destroyed", "Event loop
    is closed" before)."""
    import signal

    import grpc

    from .test_service_faults import TOKEN, TRACES, chain_span, export_request, start_serve

    serve = start_serve(tmp_path, server, backend, "--queue", redis_server.url)
    # two requests with spans of their own: one re-sending the other's spans would be answered
    # at once as a duplicate (the decision window), not wait on Redis
    body = export_request(chain_span("Is Redis answering?", "No.")).SerializeToString()
    grpc_body = export_request(chain_span("Is Redis answering now?", "No.")).SerializeToString()
    answers: dict[str, Any] = {}

    def post() -> None:
        status, headers, _ = serve.post(body, timeout=60)
        answers["http"] = (status, headers.get("Retry-After"))

    def call() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
            try:
                channel.unary_unary("/" + TRACES)(grpc_body, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60)
                answers["grpc"] = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                answers["grpc"] = exc.code()

    os.kill(redis_server._proc.pid, signal.SIGSTOP)
    try:
        clients = [threading.Thread(target=post), threading.Thread(target=call)]
        for thread in clients:
            thread.start()
        # both requests wait in the queue's XLEN: one on the pool's connection, one on a new one
        wait_until(lambda: redis_connections(serve.proc.pid, redis_server.port) >= 2, 20, "both requests to wait on Redis")
        serve.proc.send_signal(signal.SIGTERM)
        serve.proc.wait(25)  # raises TimeoutExpired past the bound
        for thread in clients:
            thread.join(30)
    finally:
        os.kill(redis_server._proc.pid, signal.SIGCONT)
        if serve.proc.poll() is None:
            serve.proc.kill()
    output = serve.log.read_text()
    assert serve.proc.returncode == 0, output[-3000:]
    assert answers == {"http": (503, "1"), "grpc": grpc.StatusCode.UNAVAILABLE}, (answers, output[-3000:])
    assert "Traceback" not in output and "Task was destroyed" not in output and "Event loop is closed" not in output, output[-5000:]
    assert "stopped (" in output


def redis_connections(pid: int, port: int) -> int:
    """TCP connections process ``pid`` holds to Redis on ``port`` (its pool opens one per
    command in flight)."""
    import psutil

    return sum(1 for c in psutil.Process(pid).net_connections("tcp") if c.raddr and c.raddr.port == port)


# ------------------------------------------------------------------------------ contexts (issue 35, item 4)


def _shared_retriever_request(roots: int, document: str) -> Any:
    """One trace: a RETRIEVER span with ``document`` and ``roots`` CHAIN root spans (each a
    candidate whose contexts are the trace's retrieved documents)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    def kv(key: str, value: str) -> Any:
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))

    trace_id = os.urandom(16)
    spans = [trace_pb2.Span(trace_id=trace_id, span_id=os.urandom(8), name="retrieve", attributes=[kv("openinference.span.kind", "RETRIEVER"), kv("retrieval.documents.0.document.content", document)])]
    spans += [trace_pb2.Span(trace_id=trace_id, span_id=os.urandom(8), name="answer", attributes=[kv("openinference.span.kind", "CHAIN"), kv("input.value", f"Where is city {i}?"), kv("output.value", f"City {i} is in France.")]) for i in range(roots)]
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=spans)])])


def test_contexts_shared_by_a_traces_spans_are_stored_once_on_the_stream(server, redis_server, client, monkeypatch):
    """5,000 root spans of one trace share its RETRIEVER documents (32 KB): one stored copy
    (Redis +164 MB before: a copy per job), read back with each job, deleted with the last
    job's acknowledgement; the stored copy counts against the queue bound."""
    from relevancy_tracer.service import ScoringService
    from relevancy_tracer.service.queue import RedisStreamQueue

    contexts_prefix = "relevancy-tracer:contexts:"
    for name in ("TRACES", "LOGS", "METRICS"):
        monkeypatch.setenv(f"OTEL_{name}_EXPORTER", "none")
    document = "Paris is the capital of France. " * 1000  # 32 KB
    service = ScoringService(openai_settings(server, queue_size=1000, max_context_chars=40_000), queue_url=redis_server.url, http_port=None, grpc_port=None)
    try:
        before = client.info("memory")["used_memory"]
        assert service.accept(_shared_retriever_request(5000, document)).accepted
        grown = client.info("memory")["used_memory"] - before
        assert client.xlen(STREAM) == 5000 and grown < 8 * 2**20, grown  # 5,000 jobs of ~300 bytes, one document
        (key,) = client.keys(contexts_prefix + "*")
        assert client.hget(key, "refs") == b"5000"
        assert not service.accept(_shared_retriever_request(1, document)).accepted  # 5,000 + 1 job + 1 stored list > 1,000
        client.delete(STREAM, key)
        assert service.accept(_shared_retriever_request(3, document)).accepted
    finally:
        service.stop(5)
    queue = RedisStreamQueue(redis_server.url)
    try:
        deliveries = queue.read("reader", 10, 100)
        assert len(deliveries) == 3 and all(d.request.contexts == [document] for d in deliveries)
        assert all(len(d.job) < 1000 for d in deliveries)  # the job carries the contexts' id, not the text
        (key,) = client.keys(contexts_prefix + "*")
        for delivery in deliveries:
            assert client.exists(key)
            queue.ack(delivery.entry_id, delivery.request.evaluation_id, delivery.request.contexts_id)
        assert not client.keys(contexts_prefix + "*") and client.xlen(STREAM) == 0
    finally:
        queue.close()


def test_dead_letters_are_bounded_in_bytes(redis_server, client):
    """Issue 35, item 5: dead letters were bounded by count only (100,000 x 41 KB = 4.1 GB of
    Redis at the default budgets); now also by the bytes of their fields: 60 letters of 41 KB
    against a 1 MiB bound keep the newest that fit, and the count matches what is stored."""
    from relevancy_tracer.service.queue import RedisStreamQueue

    queue = RedisStreamQueue(redis_server.url, dead_letter_max_bytes=1024 * 1024)
    try:
        enqueue(client, [b"x" * 41_000 + b"%d" % i for i in range(60)])  # malformed: not JSON
        for delivery in queue.read("worker", 60, 100):
            queue.dead_letter(delivery, "malformed job: not JSON", "worker")
        stored = client.xrange(DEAD_LETTER)
        size = sum(len(k) + len(v) for _, fields in stored for k, v in fields.items())
        assert size <= 1024 * 1024 and len(stored) >= 20, (size, len(stored))
        assert stored[-1][1][b"job"].endswith(b"x59") and queue.dead_letter_bytes() == size
        assert client.xlen(STREAM) == 0  # every job acknowledged
    finally:
        queue.close()


# ------------------------------------------------------------------------------ issue 42: a paused worker


def _worker_process(redis_url: str, server: Any, backend: Any, log: Path, claim_idle: float) -> subprocess.Popen:
    """`relevancy-tracer worker` as a process of its own (it can be SIGSTOPped), logging to ``log``."""
    env = subprocess_env(
        fake_model_env(server),
        RELEVANCY_TRACER_METHOD="ragas", RELEVANCY_TRACER_LLM_MAX_RETRIES="0", RELEVANCY_TRACER_CONCURRENCY="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=backend.http_endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", OTEL_BSP_SCHEDULE_DELAY="100",
    )
    command = [str(Path(sys.executable).parent / "relevancy-tracer"), "worker", "--queue", redis_url, "--claim-idle", str(claim_idle)]
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    wait_until(lambda: proc.poll() is not None or "consuming" in log.read_text(), 60, "the worker to start")
    assert proc.poll() is None, log.read_text()
    return proc


def test_a_paused_worker_whose_job_was_reclaimed_does_not_write_a_second_result(server, backend, redis_server, client, tmp_path):
    """Issue 42, item 5: worker A takes a job and is stopped (SIGSTOP) while its model request
    is in flight; worker B reclaims the job after --claim-idle (1 s), scores it and writes its
    EVALUATOR span. A is continued and its model reply arrives: it checks in Redis, atomically
    (a Lua script), that it still holds the job and that the job is not done, finds it done,
    and drops its result. One result, one EVALUATOR span (before: A wrote a second one)."""
    import signal
    import threading as _threading

    held = _threading.Event()
    from relevancy_tracer_testing import Gate

    server.chat.push(Gate(held))  # A's model request waits until the test opens it
    logs = tmp_path / "a.log", tmp_path / "b.log"
    first = _worker_process(redis_server.url, server, backend, logs[0], 1.0)
    second = None
    try:
        request = job(0)
        enqueue(client, [request])
        assert server.wait_for_requests("chat", 1, timeout=30)
        os.kill(first.pid, signal.SIGSTOP)  # paused with its request in flight, its claim no longer extended
        second = _worker_process(redis_server.url, server, backend, logs[1], 1.0)
        by_id = evaluations_by_id(backend, 1)
        wait_until(lambda: settled(client), 30, "B acknowledged the job")
        held.set()  # A's reply is ready when it runs again
        os.kill(first.pid, signal.SIGCONT)

        def a_decided() -> bool:
            return "result is dropped" in logs[0].read_text() or len(evaluator_spans(backend.spans)) >= 2

        wait_until(a_decided, 30, "worker A to write or drop its result")
        by_id = evaluations_by_id(backend, 1)
    finally:
        held.set()
        for proc in (first, second):
            if proc is not None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert len(server.requests_to("chat")) == 2  # both scored it: A was paused mid-request
    assert list(by_id) == [request.evaluation_id] and len(by_id[request.evaluation_id]) == 1, by_id
    output = logs[0].read_text()
    assert "reclaimed" in output or "finished" in output, output
    assert "Traceback" not in output + logs[1].read_text()


def test_a_worker_whose_redis_user_may_not_run_scripts_scores_each_job_once(server, backend, redis_server, client, caplog):
    """Issue 42, round of our own: a Redis ACL user without `+@scripting` (the Lua checks of a
    job's ownership answer NOPERM). The worker logs it once, checks ownership with separate
    commands, and scores each job once: 3 jobs, 3 model calls, 3 EVALUATOR spans."""
    import logging

    client.acl_setuser("fleet", enabled=True, passwords=["+fleet-pw"], keys=["*"], channels=["*"], commands=["+@all", "-@scripting"])
    url = redis_server.url.replace("redis://", "redis://fleet:fleet-pw@", 1)
    jobs = [job(i) for i in range(3)]
    enqueue(client, jobs)
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        with workers(url, openai_settings(server), claim_idle=0.4) as (worker,):
            wait_until(lambda: settled(client), 30, "the jobs scored")
    assert worker.scored == 3 and len(server.requests_to("chat")) == 3
    by_id = evaluations_by_id(backend, 3)
    assert set(by_id) == {j.evaluation_id for j in jobs} and all(len(v) == 1 for v in by_id.values())
    warnings = [r.getMessage() for r in caplog.records if "may not run Lua scripts" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


# ------------------------------------------------------------------------------ issue 42: a trimmed stream


def _pel(client: Any) -> int:
    return int(client.xpending(STREAM, "relevancy-tracer-workers")["pending"])


def test_jobs_deleted_from_the_stream_while_held_or_pending_are_counted_lost(server, backend, redis_server, client, caplog):
    """Issue 42, round of our own: the stream's entries are deleted under the fleet (``XTRIM
    MAXLEN 0`` while a worker holds 4 jobs with their model requests in flight; ``XDEL`` of 4
    jobs waiting pending for their retry after a model outage) and before any worker reclaims
    them. Each deleted job is counted lost once (``FleetWorker.lost``,
    ``relevancy.service.lost_jobs``), the held jobs' results are dropped as ``job_deleted``,
    the pending entry list is emptied, the log has a bounded number of lines, and the fleet
    goes on scoring new jobs."""
    import logging

    gate = threading.Event()
    server.chat.push(*[Gate(gate)] * 4)
    settings = openai_settings(server, llm_max_retries=0, llm_timeout=30.0, concurrency=4, max_deliveries=5)
    with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
        with workers(redis_server.url, settings, n=2, claim_idle=0.4) as fleet:
            with client.pipeline(transaction=True) as pipe:  # one MULTI: taken at once, all 4 in flight
                enqueue(pipe, [job(i) for i in range(4)])
                pipe.execute()
            assert server.wait_for_requests("chat", 4, timeout=30)
            assert client.xtrim(STREAM, maxlen=0, approximate=False) == 4
            assert _pel(client) == 4
            wait_until(lambda: _pel(client) == 0 or None, 10, "the held jobs' pending entries cleaned")
            gate.set()
            wait_until(lambda: sum(w.lost for w in fleet) >= 4, 20, "the held jobs counted lost")
            # jobs failing transiently wait pending for their retry; deleted meanwhile
            server.chat.push(*[Status(503, "model overloaded")] * 4)
            pending = [job(10 + i) for i in range(4)]
            enqueue(client, pending)
            wait_until(lambda: sum(w.retried for w in fleet) >= 4, 20, "the jobs failed once")
            ids = [entry_id for entry_id, _ in client.xrange(STREAM)]
            assert len(ids) == 4 and client.xdel(STREAM, *ids) == 4
            wait_until(lambda: _pel(client) == 0 or None, 10, "the deleted jobs' pending entries cleaned")
            wait_until(lambda: sum(w.lost for w in fleet) >= 8, 20, "the deleted jobs counted lost")
            after = job(99)
            enqueue(client, [after])
            wait_until(lambda: settled(client) and sum(w.scored for w in fleet) == 1, 20, "a new job scored")
            chat_calls = len(server.requests_to("chat"))
    assert sum(w.lost for w in fleet) == 8, [w.lost for w in fleet]
    assert sum(w.skipped for w in fleet) == 0 and sum(w.dead_lettered for w in fleet) == 0
    by_id = evaluations_by_id(backend, 1)
    assert list(by_id) == [after.evaluation_id]
    assert chat_calls <= 4 + 4 + 4  # no job re-scored, no busy loop on the deleted entries
    records = [r for r in caplog.records if r.name == "relevancy_tracer"]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records if r.exc_info]
    assert len(records) <= 4 + 4 + 8, [r.getMessage() for r in records]  # retries, and at most a line per lost job
    assert all("reclaimed by another worker" not in r.getMessage() for r in records)
