"""``relevancy-tracer serve`` and ``relevancy-tracer worker``: scoring spans of apps that never
import this package.

* :class:`ScoringService` receives OTLP traces and logs (``receiver.py``), reads the spans to
  score (``selection.py``: OpenInference, Vercel AI SDK, Langfuse and GenAI attributes,
  filters), holds each trace's candidates until its outermost call is known (``decision.py``:
  once per call whatever the batching, retries recognised), applies the decorator's samplers,
  joins GenAI content that travels as log events to its span (``join.py``, in this process,
  before queueing), counts spans that look like calls but yield nothing
  (``relevancy.service.skipped``) and queues one :class:`~relevancy_tracer.service.jobs.ScoreRequest` per span, a whole export
  request or nothing: in process (the decorator's bounded :class:`~relevancy_tracer._background.jobqueue.JobQueue`,
  the default), or on a Redis Stream (``--queue redis://...``) for a fleet. A full queue refuses
  the request with OTLP's retryable codes, so the exporter re-sends it; a request with more
  spans to score than the queue's bound is admitted whole when the queue is empty, so it is
  never refused forever. Spans with invalid ids are rejected for good (OTLP
  ``partial_success``).
* :class:`FleetWorker` consumes the stream as one consumer of the group: reclaims pending jobs
  first (their worker died, or released them after a transient failure, see ``queue.py``),
  skips jobs already done (a re-sent or reclaimed job whose evaluation id is recorded), scores,
  writes (``writer.py``), force-flushes the exporters, and only then acknowledges; malformed jobs
  and jobs failing on their ``max_deliveries``-th delivery go to the dead-letter stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import math
import threading
import time
from typing import Any, Optional

from ..config import Settings
from ..phoenix_annotations import PhoenixClient
from ..result import Status
from .._background.jobqueue import JobQueue
from .jobs import ScoreRequest
from .decision import DecisionWindow
from .join import Content, ContentJoin, Held, is_content_event
from .otlp import log_records_of, spans_of
from .queue import OUT_OF_MEMORY, describe_redis_error
from .receiver import Admission, DrainRate, OTLPServer, ReceiverLimits
from .selection import Candidate, Selection, Skipped, SpanSelector
from .telemetry import ServiceTelemetry
from .writer import Scorer

logger = logging.getLogger("relevancy_tracer")


class ServiceJob:
    """One in-process evaluation (the :class:`~relevancy_tracer._background.jobqueue.Job` protocol).

    An accepted span is never timed out for waiting in the queue (its deadline is
    ``math.inf``; the receiver refuses, retryably, what the queue has no room for): once
    running it gets ``evaluation_timeout``."""

    deadline = math.inf
    deadline_name = "evaluation_timeout"
    deferrable = False

    def __init__(self, scorer: Scorer, request: ScoreRequest, timeout: float, drain: DrainRate):
        self.scorer = scorer
        self.request = request
        self.timeout = self.deadline_limit = timeout
        self._drain = drain
        self._finished = False
        self._lock = threading.Lock()

    def _claim(self) -> bool:
        with self._lock:
            if self._finished:
                return False
            self._finished = True
            return True

    async def run(self) -> None:
        result = await self.scorer.score(self.request)
        if self._claim():
            try:
                await asyncio.to_thread(self.scorer.write, self.request, result)
            except Exception:  # an annotation write failed after retries: the span and metrics are written
                logger.warning("relevancy-tracer: writing the result of %s failed", self.request.evaluation_id, exc_info=True)
            self._drain.done()

    def finish(self, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        if self._claim():
            try:
                self.scorer.write(self.request, None, status=status, error=error, reason=reason)
            except Exception:
                logger.warning("relevancy-tracer: writing the %s outcome of %s failed", status, self.request.evaluation_id, exc_info=True)
            self._drain.done()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class ScoringService:
    """The OTLP receiver with its queue and, in process, its scorers.

    Args:
        settings: models, method, capture, ``concurrency``, ``queue_size``,
            ``evaluation_timeout``, ``phoenix_url``, ``service_token``,
            ``max_request_bytes`` and the ``receiver_*`` bounds (default: from the environment).
        selection: which spans to score (default: OpenInference CHAIN/AGENT/LLM, Vercel AI SDK,
            Langfuse and GenAI spans, outermost per trace, the settings' ``sample_ratio`` and
            ``rate_limit``). The settings' ``decision_wait`` and ``decision_max_traces`` size
            the decision window (``decision_wait=0``: outermost within each request).
        queue_url: ``redis://host:port/db`` to queue on a Redis Stream for a fleet of
            :class:`FleetWorker`; None to score in this process.
        host, http_port, grpc_port: where to listen (0: a free port; None: protocol off).
        tls_cert, tls_key: PEM files: serve HTTPS and gRPC over TLS (both or neither).
        allow_unauthenticated: listen on a non-loopback ``host`` without ``service_token``.
        limits: the receiver's connection and time bounds (default :class:`ReceiverLimits`
            from the settings' ``max_request_bytes`` and ``receiver_*``).

    Raises:
        ValueError: a non-loopback ``host`` without ``service_token`` and without
            ``allow_unauthenticated`` (anyone reaching the port would spend the model budget);
            only one of ``tls_cert`` / ``tls_key``.
        OSError: from :meth:`start` when a port is taken or the TLS files cannot be loaded.
    """

    def __init__(
        self,
        settings: Optional[Settings] = None,
        *,
        selection: Optional[Selection] = None,
        queue_url: Optional[str] = None,
        host: str = "127.0.0.1",
        http_port: Optional[int] = 4318,
        grpc_port: Optional[int] = 4317,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        allow_unauthenticated: bool = False,
        limits: Optional[ReceiverLimits] = None,
    ):
        self.settings = settings or Settings.resolve()
        s = self.settings
        if not s.service_token and not allow_unauthenticated and not is_loopback(host):
            raise ValueError(f"serve on {host} without a service token would let anyone who reaches the port spend the model budget: set RELEVANCY_TRACER_SERVICE_TOKEN (clients send Authorization: Bearer <token>), or pass --allow-unauthenticated when a Collector in front authenticates")
        if s.service_token and not tls_cert and not is_loopback(host):
            logger.warning("relevancy-tracer serve: the service token travels in clear text on %s; use --tls-cert/--tls-key or a TLS-terminating proxy", host)
        self.selector = SpanSelector(selection or Selection(sample_ratio=s.sample_ratio, rate_limit=s.rate_limit, max_contexts=s.max_contexts, max_context_chars=s.max_context_chars))
        self.drain = DrainRate()
        self.queue: Any = None
        self.jobs: Optional[JobQueue] = None
        if queue_url:
            from .queue import RedisStreamQueue

            self.queue = RedisStreamQueue(queue_url, max_length=s.queue_size)
            depth = self.queue.depth
        else:
            self.jobs = JobQueue(queue_size=s.queue_size, concurrency=s.concurrency, name="relevancy-tracer-service")
            depth = lambda: self.jobs.depth  # noqa: E731
        self.telemetry = ServiceTelemetry(queue_depth=depth)
        self.scorer = None if self.queue is not None else Scorer(s, self.telemetry, PhoenixClient(s.phoenix_url) if s.phoenix_url else None)
        self.limits = limits or ReceiverLimits(
            max_request_bytes=s.max_request_bytes,
            max_connections=s.receiver_max_connections,
            idle_timeout=s.receiver_idle_timeout,
            body_timeout=s.receiver_body_timeout,
            max_inflight=s.receiver_max_inflight,
        )
        # attribute texts are cut before selection parses them: one character past the largest
        # content budget keeps the scorer's truncation visible
        self._max_text_chars = max(s.max_question_chars, s.max_answer_chars, s.max_context_chars, s.max_content_chars) + 1
        self.join = ContentJoin(s.join_ttl, s.join_max_entries, 4 * s.max_request_bytes, on_expired=self._expired)
        self._join_expired = self.telemetry.meter_provider.get_meter("relevancy_tracer").create_counter("relevancy.service.join.expired", unit="{call}", description="Halves of GenAI calls (a span, or its content events) dropped before the other half arrived, by relevancy.join.reason")
        self.window = DecisionWindow(s.decision_wait, s.decision_max_traces, 20 * s.decision_max_traces, 4 * s.max_request_bytes, max_documents=s.max_contexts, max_document_chars=s.max_context_chars, max_pending_hold=s.join_ttl / 2, on_outcome=self._decided) if s.decision_wait > 0 else None
        meter = self.telemetry.meter_provider.get_meter("relevancy_tracer")
        self._decisions = meter.create_counter("relevancy.service.decisions", unit="{span}", description="Candidate spans by what the decision window did with them, by relevancy.decision.outcome: root (a trace root, chosen at once), window (chosen when its trace's window ended), early (chosen early: a bound was reached), covered (nested in a chosen call), duplicate (a span id seen before: retry or duplicate), late (arrived after a call nested in it was scored: not scored), dropped (chosen early and refused by a full queue)")
        self._skipped_counter = meter.create_counter("relevancy.service.skipped", unit="{span}", description="Spans that look like an LLM, chain or agent call but yield no question or answer, by relevancy.source and relevancy.reason")
        self.skipped_spans: dict[tuple[str, str], int] = {}
        self._skip_logged: dict[tuple[str, str], float] = {}
        self._skip_lock = threading.Lock()
        self._sweeping = threading.Event()
        self._sweeper: Optional[threading.Thread] = None
        self.skipped: dict[str, int] = {}
        self.server = OTLPServer(self.accept, accept_logs=self.accept_logs, host=host, http_port=http_port, grpc_port=grpc_port, retry_after=self._retry_after, on_refusal=self._refused, token=s.service_token, tls_cert=tls_cert, tls_key=tls_key, limits=self.limits)
        self.accepted = 0
        self.refused = 0

    def start(self) -> "ScoringService":
        self.server.start()
        self._sweeper = threading.Thread(target=self._sweep, name="relevancy-tracer-join", daemon=True)
        self._sweeper.start()
        logger.info("relevancy-tracer serve: OTLP/HTTP on %s:%s, OTLP/gRPC on %s:%s, queue %s, %s, %s", self.server.host, self.server.http_port, self.server.host, self.server.grpc_port, "redis" if self.queue is not None else "in-process", "TLS" if self.server.tls else "no TLS", "bearer token required" if self.settings.service_token else "no authentication")
        return self

    def accept(self, request: Any) -> Admission:
        """Queue the request's selected spans, all or none.

        Returns an :class:`Admission`: not accepted (retryable) when the queue has no room for
        all of them, unless the queue is empty (a request larger than ``queue_size`` is then
        taken whole: it is never refused forever; ``max_request_bytes`` bounds it); spans with
        invalid trace or span ids are rejected for good and counted in ``rejected_spans``. GenAI
        inference spans without content are joined with their held content events, or held
        for them (``join.py``)."""
        s = self.settings
        spans = spans_of(request, self._max_text_chars)
        valid = [span for span in spans if span.ids_valid]
        rejected = len(spans) - len(valid)
        message = f"{rejected} span(s) rejected: a trace id must be 16 bytes and a span id 8, not all zeros" if rejected else ""
        classified, skipped = self.selector.classify(valid)
        if self.window is None:  # decide within this request
            candidates, pending = self.selector.choose(valid, classified)
            admission = self._admit(candidates, pending, {}, Admission(True, rejected, message))
            if admission.accepted:  # a trace with a call scored: its other spans are not counted
                scored = {c.span.trace_id for c in candidates + pending}
                self._count_skipped([item for item in skipped if item.span.trace_id not in scored])
            return admission
        window = self.window
        with window.lock:
            plan = window.plan(valid, classified, skipped)
            window.reserve(plan)
        admission = Admission(False)
        try:  # queued outside the window's lock: offers to the queue stay concurrent
            ready = [c for c in plan.ready if self.selector.sampled(c)]
            admission = self._admit([c for c in ready if c.convention != "genai-events"], [c for c in ready if c.convention == "genai-events"], {}, Admission(True, rejected, message))
        finally:
            with window.lock:
                window.release(plan)
                if admission.accepted:  # else nothing is remembered: the exporter re-sends the request
                    lost = window.commit(plan)
                    early, more = window.enforce()
        if not admission.accepted:
            return admission
        self._queue_chosen(early, reopen=False)
        self._count_skipped(lost + more)
        return admission

    def accept_logs(self, request: Any) -> Admission:
        """Join the request's GenAI content events to their spans (``join.py``) and queue the
        calls now complete, all or none (not accepted, retryable, when the queue has no room:
        the buffer is then left as it was). Other log records are ignored."""
        found = self.join.fold(record for record in log_records_of(request, self._max_text_chars) if is_content_event(record) and record.ids_valid)
        return self._admit([], [], found, Admission(True))

    def _admit(self, ready: list[Candidate], pending: list[Candidate], contents: dict[tuple[str, str], Content], admission: Admission) -> Admission:
        """Join ``pending`` spans and event ``contents`` with the held halves, queue ``ready``
        and the completed calls, then hold the rest; under the join's lock, so a refusal
        changes nothing."""
        join = self.join
        if not pending and not contents and all(c.convention not in ("genai", "genai-events") for c in ready):
            # nothing to join: admissions stay concurrent (no lock around the queue's offer)
            if ready and not self._offer(ready):
                return Admission(False)
            self.accepted += len(ready)
            return admission
        skipped: list[tuple[Candidate, str]] = []
        finished: list[tuple[str, str]] = []
        holding: dict[tuple[str, str], Held] = {}
        now = join.clock()

        def settle(key: tuple[str, str], candidate: Candidate, content: Content) -> None:
            texts, reason = content.outcome()
            finished.append(key)
            if texts is None:
                skipped.append((candidate, str(reason)))
            else:
                ready.append(Candidate(candidate.span, texts[0], texts[1], candidate.contexts, "genai-events"))

        with join.lock:
            for candidate in list(ready):  # GenAI content on the span: events held for it are moot
                if candidate.convention == "genai":
                    finished.append((candidate.span.trace_id, candidate.span.span_id))
            for candidate in pending:
                key = (candidate.span.trace_id, candidate.span.span_id)
                held = join.get(key)
                if join.done(key) or (held is not None and held.span is not None):
                    continue  # a re-sent span
                content = held.content if held is not None else Content()
                if content.complete:
                    settle(key, candidate, content)
                else:  # held without its attributes: only its name, ids and app are needed later
                    resource = {k: v for k, v in candidate.span.resource.items() if k in ("service.name", "openinference.project.name")}
                    holding[key] = Held(held.since if held is not None else now, dataclasses.replace(candidate.span, attributes={}, resource=resource), candidate.contexts, content)
            for key, content in contents.items():
                if join.done(key):
                    continue  # a late event of a call already scored or skipped
                held = join.get(key)
                merged = held.content.merge(content) if held is not None else content
                if held is not None and held.span is not None and merged.complete:
                    settle(key, Candidate(held.span, "", "", held.contexts, "genai-events"), merged)
                else:
                    holding[key] = Held(held.since if held is not None else now, held.span if held is not None else None, held.contexts if held is not None else None, merged)
            if ready and not self._offer(ready):
                return Admission(False)
            join.commit(finished, holding)
        self.accepted += len(ready)
        for candidate, reason in skipped:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
            self.telemetry.metrics.count(candidate.span.name, Status.SKIPPED, reason=reason, service_name=candidate.span.service_name)
        return admission

    def _offer(self, candidates: list[Candidate]) -> bool:
        """Queue one job per candidate, all or none."""
        s = self.settings
        requests = [ScoreRequest.from_candidate(c, s.method, s.max_question_chars, s.max_answer_chars) for c in candidates]
        if self.queue is not None:
            try:
                ok = self.queue.offer(requests)
            except Exception as exc:  # Redis down: refuse (retryable) rather than lose the spans
                logger.warning("relevancy-tracer: queueing on Redis failed (%s); the request is refused (retryable)", describe_redis_error(exc))
                ok = False
        else:
            assert self.jobs is not None and self.scorer is not None
            ok = self.jobs.submit_all([ServiceJob(self.scorer, r, s.evaluation_timeout, self.drain) for r in requests], admit_when_empty=True)
        return bool(ok)

    def _queue_chosen(self, chosen: list[Candidate], reopen: bool = True) -> None:
        """Queue candidates the decision window chose (outside its lock). Refused by a full
        queue: held again for another window (``reopen``), else dropped and counted."""
        chosen = [c for c in chosen if self.selector.sampled(c)]
        if not chosen:
            return
        admission = self._admit([c for c in chosen if c.convention != "genai-events"], [c for c in chosen if c.convention == "genai-events"], {}, Admission(True))
        if admission.accepted:
            return
        if reopen and self.window is not None:
            with self.window.lock:
                self.window.reopen(chosen)
        else:
            self._decided("dropped", len(chosen))
            logger.warning("relevancy-tracer serve: %d chosen span(s) dropped: the queue is full and the decision window at its bound", len(chosen))

    def decide(self, everything: bool = False) -> None:
        """Queue the calls whose trace's decision window ended (every held call with
        ``everything``: :meth:`flush` and :meth:`stop` do), and count their traces' skipped
        spans."""
        if self.window is None:
            return
        with self.window.lock:
            chosen, skipped = self.window.due(everything)
        self._queue_chosen(chosen, reopen=not everything)
        self._count_skipped(skipped)

    def _decided(self, outcome: str, count: int) -> None:
        self._decisions.add(count, {"relevancy.decision.outcome": outcome})

    def _count_skipped(self, skipped: list[Skipped]) -> None:
        """Count spans that look like calls but yield nothing, by source and reason, with one
        log line per (source, reason) a minute naming the attribute keys seen (never values:
        they may be user text)."""
        now = time.monotonic()
        for item in skipped:
            key = (item.source, item.reason)
            with self._skip_lock:
                self.skipped_spans[key] = self.skipped_spans.get(key, 0) + 1
                log = now - self._skip_logged.get(key, -1e9) >= 60.0
                if log:
                    self._skip_logged[key] = now
            self._skipped_counter.add(1, {"relevancy.source": item.source, "relevancy.reason": item.reason})
            if log:
                keys = sorted(str(k)[:80] for k in item.span.attributes)
                logger.warning("relevancy-tracer serve: %s span %r yields no question or answer (%s); attribute keys: %s%s (further such spans are counted in relevancy.service.skipped, logged once a minute)", item.source, item.span.name[:80], item.reason, ", ".join(keys[:40]), f" and {len(keys) - 40} more" if len(keys) > 40 else "")

    def _expired(self, reason: str, count: int) -> None:
        self._join_expired.add(count, {"relevancy.join.reason": reason})

    def _sweep(self) -> None:
        """Expire held halves and decide the traces whose window ended, while serving (every
        quarter of ``join_ttl`` and of ``decision_wait``, at most 1 s)."""
        while not self._sweeping.wait(min(1.0, self.settings.join_ttl / 4, self.settings.decision_wait / 4 or 1.0)):
            try:
                self.join.expire()
            except Exception:
                logger.warning("relevancy-tracer: expiring held GenAI calls failed", exc_info=True)
            try:
                self.decide()
            except Exception:
                logger.warning("relevancy-tracer: deciding held traces failed", exc_info=True)

    def _retry_after(self) -> int:
        try:
            backlog = self.queue.depth() if self.queue is not None else (self.jobs.depth if self.jobs else 0)
        except Exception:
            backlog = 0
        return self.drain.retry_after(backlog)

    def _refused(self, protocol: str, reason: str = "queue_full") -> None:
        self.refused += 1
        self.telemetry.refused.add(1, {"rpc.system": "grpc" if protocol == "grpc" else "http", "error.type": reason})

    def flush(self, timeout: float = 30.0) -> bool:
        """Decide every trace held in the decision window, then (in process) wait until every
        queued evaluation was written, then export."""
        deadline = time.monotonic() + timeout
        self.decide(everything=True)  # every call received so far: its trace is decided now
        ok = self.jobs.flush(timeout) if self.jobs is not None else True
        return self.telemetry.force_flush(max(0.0, deadline - time.monotonic())) and ok

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop receiving, finish (in process) what is queued within ``timeout``, export, close."""
        deadline = time.monotonic() + timeout
        self.server.stop(grace=min(2.0, timeout))
        self._sweeping.set()
        try:
            self.decide(everything=True)  # held calls are queued, not lost
        except Exception:
            logger.warning("relevancy-tracer: deciding held traces at stop failed", exc_info=True)
        ok = True
        if self.jobs is not None:
            ok = self.jobs.shutdown(max(0.0, deadline - time.monotonic()))
        if self.queue is not None:
            self.queue.close()
        return self.telemetry.shutdown(max(0.0, deadline - time.monotonic())) and ok


#: Engine statuses worth another delivery: the model was unreachable, failed (5xx, 429 after
#: the client's retries) or too slow. Other failures (invalid JSON after re-asking, unreadable
#: scores, invalid input) are the evaluation's outcome and are written as such at once.
TRANSIENT_STATUSES = (Status.MODEL_ERROR, Status.TIMEOUT)


def _redis_errors() -> tuple:
    import redis

    return (redis.RedisError,)


class FleetWorker:
    """A consumer of the Redis Stream: scores jobs and acknowledges them once exported.

    Every job taken ends in exactly one of: scored (or a final engine outcome such as
    ``invalid_json``) and acknowledged; already done and acknowledged; left pending for
    redelivery with backoff (a transient failure before its ``max_deliveries``-th delivery);
    moved to the dead-letter stream with its error (malformed, or a failure on its
    ``max_deliveries``-th delivery). A failing job never blocks another taken with it, and
    while a job is held its claim is extended, so no other worker takes it.

    Args:
        queue_url: the stream's Redis. settings: as for :class:`ScoringService`
            (``concurrency`` jobs are taken and scored at once; ``max_deliveries``;
            ``evaluation_timeout``). claim_idle: seconds (> 0) a held job may go without a claim
            extension before another worker reclaims it (extensions are sent every quarter of
            it; a released job waits ``claim_idle * 2 ** (deliveries - 1)``). consumer: the
            consumer name (default host and pid).

    Attributes:
        scored, skipped, failed, dead_lettered: jobs by how they ended (skipped: already done;
        failed: a final engine outcome other than scored, written and acknowledged); each job
        taken ends in exactly one of them. reclaimed: deliveries of pending jobs; retried:
        deliveries that failed transiently and left the job pending.
    """

    def __init__(self, queue_url: str, settings: Optional[Settings] = None, *, claim_idle: float = 30.0, consumer: Optional[str] = None):
        from .queue import RedisStreamQueue, consumer_name

        self.settings = settings or Settings.resolve()
        self.queue = RedisStreamQueue(queue_url, max_length=self.settings.queue_size, claim_idle=claim_idle)
        self.consumer = consumer or consumer_name()
        self.telemetry = ServiceTelemetry(queue_depth=self.queue.depth)
        phoenix = PhoenixClient(self.settings.phoenix_url) if self.settings.phoenix_url else None
        self.scorer = Scorer(self.settings, self.telemetry, phoenix)
        self.scored = self.skipped = self.reclaimed = self.failed = self.retried = self.dead_lettered = 0
        self._stop = threading.Event()
        self._held: dict[str, float] = {}  # entry id -> monotonic time until which its claim is extended
        # scored and exported, their acknowledgement failed (Redis unreachable): retried before
        # new jobs are taken, their claims extended meanwhile so no worker scores them again
        self._unacked: dict[str, tuple[Optional[str], Optional[str]]] = {}
        self._held_lock = threading.Lock()
        # a held job's claim is extended while it can still be in progress: the evaluation, the
        # writes and the exporters' flush (30 s); after that a wedged worker lets it go
        self._hold_limit = self.settings.evaluation_timeout + 60.0

    def stop(self) -> None:
        """Ask :meth:`run` to return after the jobs in hand (call from a signal handler)."""
        self._stop.set()

    def run(self, max_jobs: Optional[int] = None) -> None:
        """Consume until :meth:`stop` (or ``max_jobs`` jobs handled). A failing step (Redis
        unreachable) is retried after 1 s, doubling up to 30 s while it keeps failing."""
        loop = asyncio.new_event_loop()
        heartbeat = threading.Thread(target=self._extend_claims, name="relevancy-tracer-claims", daemon=True)
        heartbeat.start()
        try:
            handled = 0
            pause = 1.0
            while not self._stop.is_set() and (max_jobs is None or handled < max_jobs):
                try:
                    handled += loop.run_until_complete(self.step())
                    pause = 1.0
                except Exception as exc:  # Redis unreachable or full for a moment: retry, never crash the worker
                    if isinstance(exc, _redis_errors()):
                        logger.warning("relevancy-tracer worker: a step failed (%s); retrying in %.0f s", describe_redis_error(exc), pause)
                    else:
                        logger.warning("relevancy-tracer worker: a step failed; retrying in %.0f s", pause, exc_info=True)
                    self._stop.wait(pause)
                    pause = min(30.0, pause * 2)
        finally:
            self._stop.set()
            heartbeat.join(5.0)
            loop.close()
            self.telemetry.shutdown(10.0)
            self.queue.close()

    def _extend_claims(self) -> None:
        interval = self.queue.claim_idle / 4
        while not self._stop.wait(interval):
            now = time.monotonic()
            with self._held_lock:
                entry_ids = [entry_id for entry_id, until in self._held.items() if until > now]
            try:
                self.queue.extend(self.consumer, entry_ids)
            except Exception:
                logger.warning("relevancy-tracer worker: extending the claim of %d jobs failed", len(entry_ids), exc_info=True)

    def _hold(self, deliveries: list) -> None:
        until = time.monotonic() + self._hold_limit
        with self._held_lock:
            for delivery in deliveries:
                self._held[delivery.entry_id] = until

    def _release(self, deliveries: list) -> None:
        with self._held_lock:
            for delivery in deliveries:
                if delivery.entry_id not in self._unacked:
                    self._held.pop(delivery.entry_id, None)

    async def step(self, block_ms: int = 500) -> int:
        """Take up to ``concurrency`` jobs (reclaimed ones first), score, write, export and
        acknowledge them; returns how many were taken."""
        count = max(1, self.settings.concurrency)
        for entry_id, (evaluation_id, contexts_id) in list(self._unacked.items()):  # raises while Redis is unreachable
            self.queue.ack(entry_id, evaluation_id, contexts_id)
            del self._unacked[entry_id]
            with self._held_lock:
                self._held.pop(entry_id, None)
        deliveries = self.queue.reclaim(self.consumer, count)
        if deliveries:
            self.reclaimed += len(deliveries)
            self.telemetry.reclaimed.add(len(deliveries))
        else:
            deliveries = await asyncio.to_thread(self.queue.read, self.consumer, count, block_ms)
        self._hold(deliveries)
        try:
            await self._handle(deliveries)
        finally:
            self._release(deliveries)
        return len(deliveries)

    async def _handle(self, deliveries: list) -> None:
        limit = self.settings.max_deliveries
        todo = []
        for delivery in deliveries:
            if delivery.request is None:
                self._dead_letter(delivery, f"malformed job: {delivery.error}", "malformed")
            elif self.queue.is_done(delivery.request.evaluation_id):
                self.skipped += 1
                self._ack(delivery, None)
            elif delivery.deliveries > limit:  # every worker holding it stopped before finishing
                self._dead_letter(delivery, f"not acknowledged after {delivery.deliveries - 1} deliveries", "unacknowledged")
            else:
                todo.append(delivery)
        if not todo:
            return
        results = await asyncio.gather(*(self.scorer.score(d.request) for d in todo), return_exceptions=True)
        written = []
        for delivery, result in zip(todo, results):
            request = delivery.request
            if isinstance(result, BaseException):  # a bug on this job's input: never blocks the others
                if not isinstance(result, Exception):
                    raise result
                self._failed(delivery, f"scoring raised {type(result).__name__}", type(result).__name__)
                continue
            transient = result.status in TRANSIENT_STATUSES
            if transient and delivery.deliveries < limit:
                self._failed(delivery, result.status, result.status)
                continue
            try:
                await asyncio.to_thread(self.scorer.write, request, result)
            except Exception as exc:  # an annotation write failed after retries
                self._failed(delivery, f"writing the result failed: {type(exc).__name__}", "write_failed")
                continue
            written.append((delivery, result, transient))
        if written and not await asyncio.to_thread(self.telemetry.force_flush, 30.0):
            for delivery, _, _ in written:
                self._failed(delivery, "the exporters did not flush", "export_failed")
            return
        for delivery, result, transient in written:
            if transient:  # its max_deliveries-th failure: final (the error span is written)
                self._dead_letter(delivery, f"{result.status} on delivery {delivery.deliveries} of {limit}", result.status)
                continue
            self._ack(delivery, delivery.request.evaluation_id)
            if result.status == Status.SCORED:
                self.scored += 1
            else:
                self.failed += 1

    def _failed(self, delivery: Any, error: str, error_type: str) -> None:
        """A failure of one delivery: pending for redelivery with backoff, or dead-lettered on
        the ``max_deliveries``-th."""
        if delivery.deliveries >= self.settings.max_deliveries:
            self._dead_letter(delivery, f"{error} on delivery {delivery.deliveries} of {self.settings.max_deliveries}", error_type)
            return
        self.retried += 1
        self.telemetry.retried.add(1, {"error.type": error_type})
        logger.warning("relevancy-tracer worker: job %s failed (%s) on delivery %d of %d; redelivered in %.0f s", delivery.entry_id, error, delivery.deliveries, self.settings.max_deliveries, self.queue.retry_delay(delivery.deliveries))

    def _ack(self, delivery: Any, evaluation_id: Optional[str]) -> None:
        """Acknowledge one job; never raises. Redis at ``maxmemory``: acknowledged without its
        done marker (see :meth:`RedisStreamQueue.ack`). Redis unreachable: kept, its claim
        extended, and retried before the next jobs are taken (:meth:`step`): it is not
        delivered again, so not scored twice."""
        contexts_id = delivery.request.contexts_id if delivery.request is not None else None
        try:
            if not self.queue.ack(delivery.entry_id, evaluation_id, contexts_id):
                logger.warning("relevancy-tracer worker: job %s acknowledged without its done marker: %s", delivery.entry_id, OUT_OF_MEMORY)
        except Exception as exc:
            with self._held_lock:
                self._unacked[delivery.entry_id] = (evaluation_id, contexts_id)
                self._held[delivery.entry_id] = float("inf")
            logger.warning("relevancy-tracer worker: acknowledging job %s failed (%s); retried before the next jobs are taken (it stays claimed by this worker)", delivery.entry_id, describe_redis_error(exc))

    def _dead_letter(self, delivery: Any, error: str, error_type: str) -> None:
        try:
            self.queue.dead_letter(delivery, error, self.consumer)
        except Exception as exc:  # Redis full (XADD refused) or unreachable: nothing changed
            self.telemetry.retried.add(1, {"error.type": "dead_letter_failed"})
            logger.warning("relevancy-tracer worker: moving job %s to %s failed (%s); it stays pending and is moved on a later delivery (%s)", delivery.entry_id, self.queue.dead_letter_stream, describe_redis_error(exc), error)
            return
        self.dead_lettered += 1
        self.telemetry.dead_lettered.add(1, {"error.type": error_type})
        logger.warning("relevancy-tracer worker: job %s moved to %s: %s", delivery.entry_id, self.queue.dead_letter_stream, error)
