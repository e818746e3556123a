"""``relevancy-tracer serve``: the OTLP receiver that scores spans of apps that never import
this package.

:class:`ScoringService` receives OTLP traces and logs (``receiver.py``; metrics are counted
and discarded), reads the spans to
score (``selection.py``: OpenInference, Vercel AI SDK, Langfuse, Traceloop and GenAI
attributes, filters), holds each trace's candidates until its outermost call is known
(``decision.py``: once per call whatever the batching, retries recognised), applies the
decorator's samplers, joins GenAI content that travels as log events to its span (``join.py``,
in this process, before queueing), counts spans that look like calls but yield nothing
(``relevancy.service.skipped``) and queues one :class:`~relevancy_tracer.service.jobs.ScoreRequest`
per span, a whole export request or nothing: in process (the decorator's bounded
:class:`~relevancy_tracer._background.jobqueue.JobQueue`, the default), or on a Redis Stream
(``--queue redis://...``) for a fleet of
:class:`~relevancy_tracer.service.fleet_worker.FleetWorker` processes. A full queue refuses the
request with OTLP's retryable codes, so the exporter re-sends it; a request with more spans to
score than the queue's bound is admitted whole when the queue is empty, so it is never refused
forever. Spans with invalid ids are rejected for good (OTLP ``partial_success``).
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
from ..result import Status
from .._background.jobqueue import JobQueue
from .jobs import ScoreRequest
from .decision import DecisionWindow
from .join import Content, ContentJoin, Held, is_content_event
from .otlp import log_records_of, spans_of
from .queue import describe_redis_error
from .receiver import Admission, DrainRate, OTLPServer, ReceiverLimits
from .selection import Candidate, Selection, Skipped, SpanSelector
from .telemetry import ServiceTelemetry
from .writer import Scorer

logger = logging.getLogger("relevancy_tracer")

#: What the skip log line adds for a (source, reason): how the app turns it off or on.
SKIP_HINTS = {("traceloop", "content_not_captured"): ": the app records no content, traceloop-sdk runs with TRACELOOP_TRACE_CONTENT=false; set it to true to score its calls"}


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


#: Descriptors `serve` keeps for itself beyond its connections (listeners, Redis, exporters,
#: the model clients' pools, log files).
OWN_DESCRIPTORS = 256


def descriptors_needed(max_connections: int) -> int:
    """File descriptors ``serve`` may hold with ``receiver_max_connections`` at
    ``max_connections``: HTTP connections, as many lingering 503s, gRPC connections, and
    :data:`OWN_DESCRIPTORS`."""
    return 3 * max_connections + OWN_DESCRIPTORS


def ensure_descriptors(needed: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards ``needed`` (never above the hard
    limit, never lowering it), as servers commonly do at start; warn once when the hard limit
    is below ``needed``. Returns the soft limit in force. Never raises."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        if soft != resource.RLIM_INFINITY and soft < needed:
            logger.warning(
                "relevancy-tracer serve: the file descriptor limit (%d) is below the %d that receiver_max_connections"
                " may need (3 x connections + %d); lower RELEVANCY_TRACER_RECEIVER_MAX_CONNECTIONS or raise the limit",
                soft, needed, OWN_DESCRIPTORS,
            )
        return int(soft)
    except (ImportError, ValueError, OSError):  # no resource module (Windows), or not allowed
        return -1


def token_problem(token: Optional[str]) -> Optional[str]:
    """Why a bearer token can never match, or None when it can (or is unset). A client sends
    ``Authorization: Bearer <token>`` as an HTTP header or gRPC metadata, whose values are
    printable ASCII (gRPC: 0x20-0x7E; surrounding whitespace is dropped by both): a token with
    another character (a newline inside, a control or non-ASCII character) is never received
    as it was set. Surrounding whitespace is stripped by the setting itself."""
    if token is None:
        return None
    if not token.strip():
        return "is empty"
    for index, char in enumerate(token):
        if not " " <= char <= "~":
            return f"holds {char!r} at character {index + 1} (not printable ASCII)"
    if token != token.strip():
        return "starts or ends with whitespace"
    return None


class ScoringService:
    """The OTLP receiver with its queue and, in process, its scorers.

    Args:
        settings: models, method, capture, ``concurrency``, ``queue_size``,
            ``evaluation_timeout``, ``phoenix_url``, ``service_token``,
            ``max_request_bytes`` and the ``receiver_*`` bounds (default: from the environment).
        selection: which spans to score (default: OpenInference CHAIN/AGENT/LLM, Vercel AI SDK,
            Langfuse, Traceloop workflow or agent and GenAI spans, outermost per trace, the
            settings' ``sample_ratio`` and ``rate_limit``). The settings' ``decision_wait`` and
            ``decision_max_traces`` size the decision window (``decision_wait=0``: outermost within each request).
        queue_url: ``redis://host:port/db`` to queue on a Redis Stream for a fleet of
            :class:`~relevancy_tracer.service.fleet_worker.FleetWorker`; None to score in this process.
        host, http_port, grpc_port: where to listen (0: a free port; None: protocol off).
        tls_cert, tls_key: PEM files: serve HTTPS and gRPC over TLS (both or neither).
        allow_unauthenticated: listen on a non-loopback ``host`` without ``service_token``.
        limits: the receiver's connection and time bounds (default :class:`ReceiverLimits`
            from the settings' ``max_request_bytes`` and ``receiver_*``).

    Raises:
        ValueError: a ``service_token`` no client can send (see :func:`token_problem`); a
            non-loopback ``host`` without ``service_token`` and without
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
        unsendable = token_problem(s.service_token)
        if unsendable:
            raise ValueError(
                f"the service token (RELEVANCY_TRACER_SERVICE_TOKEN) {unsendable}: no client could authenticate;"
                " use printable ASCII (e.g. `openssl rand -hex 32`)"
            )
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
        self.scorer = None if self.queue is not None else Scorer.for_settings(s, self.telemetry)
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
        self._decisions = meter.create_counter("relevancy.service.decisions", unit="{span}", description="Candidate spans by what the decision window did with them, by relevancy.decision.outcome: root (a trace root, chosen at once), window (chosen when its trace's window ended), early (chosen early: a bound was reached), covered (nested in a chosen call), duplicate (a span id seen before: retry or duplicate), late (arrived after a call nested in it was scored: not scored), dropped (chosen early and refused by a full queue), uncaptured (a GenAI call awaiting content events inside a call whose app records no content: not held; the outer call is counted in relevancy.service.skipped as content_not_captured)")
        self._skipped_counter = meter.create_counter("relevancy.service.skipped", unit="{span}", description="Spans that look like an LLM, chain or agent call but yield no question or answer, by relevancy.source and relevancy.reason")
        self._discarded_counter = meter.create_counter("relevancy.service.discarded", unit="{item}", description="Items received and discarded, by relevancy.signal: metrics (OTLP metrics export requests are answered OK and discarded; SDKs send metrics to the traces endpoint by default), logs (log records that are not GenAI content events)")
        #: items discarded so far, by signal (``metrics``: metrics; ``logs``: log records)
        self.discarded: dict[str, int] = {}
        self.skipped_spans: dict[tuple[str, str], int] = {}
        self._skip_logged: dict[tuple[str, str], float] = {}
        self._skip_lock = threading.Lock()
        self._sweeping = threading.Event()
        self._sweeper: Optional[threading.Thread] = None
        self.skipped: dict[str, int] = {}
        self.server = OTLPServer(self.accept, accept_logs=self.accept_logs, on_metrics=self._discard_metrics, host=host, http_port=http_port, grpc_port=grpc_port, retry_after=self._retry_after, on_refusal=self._refused, token=s.service_token, tls_cert=tls_cert, tls_key=tls_key, limits=self.limits)
        self.accepted = 0
        self.refused = 0

    def start(self) -> "ScoringService":
        """Listen and serve (see the class). Raises OSError when a port is taken or the TLS
        files cannot be loaded."""
        ensure_descriptors(descriptors_needed(self.limits.max_connections))
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
        spans = spans_of(request, self._max_text_chars)
        valid = [span for span in spans if span.ids_valid]
        rejected = len(spans) - len(valid)
        message = f"{rejected} span(s) rejected: a trace id must be 16 bytes and a span id 8, not all zeros" if rejected else ""
        classified, skipped = self.selector.classify(valid)
        settled = [(item.span.trace_id, item.span.span_id) for item in skipped if item.source == "genai"]
        if settled:  # a GenAI call read from its span (a tool-call turn): its content events are moot
            with self.join.lock:
                self.join.commit(settled, {})
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
        the buffer is then left as it was). Other log records are discarded and counted
        (``relevancy.service.discarded``, ``relevancy.signal=logs``)."""
        records = log_records_of(request, self._max_text_chars)
        content = [record for record in records if is_content_event(record) and record.ids_valid]
        admission = self._admit([], [], self.join.fold(content), Admission(True))
        if admission.accepted and len(records) > len(content):
            self._discard("logs", len(records) - len(content))
        return admission

    def _discard_metrics(self, metrics: int) -> None:
        """A metrics export request, answered OK and discarded: its metrics are counted."""
        self._discard("metrics", metrics)

    def _discard(self, signal: str, count: int) -> None:
        with self._skip_lock:
            self.discarded[signal] = self.discarded.get(signal, 0) + count
        self._discarded_counter.add(count, {"relevancy.signal": signal})

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
                ready.append(
                    Candidate(candidate.span, texts[0], texts[1], candidate.contexts, "genai-events", content.history)
                )

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
                    holding[key] = Held(
                        held.since if held is not None else now,
                        dataclasses.replace(candidate.span, attributes={}, resource=resource, events=[]),
                        candidate.contexts,
                        content,
                    )
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
        requests = [ScoreRequest.from_candidate(c, s.method, s.max_question_chars, s.max_answer_chars, s.max_history_turns, s.max_history_chars) for c in candidates]
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
                logger.warning("relevancy-tracer serve: %s span %r yields no question or answer (%s%s); attribute keys: %s%s (further such spans are counted in relevancy.service.skipped, logged once a minute)", item.source, item.span.name[:80], item.reason, SKIP_HINTS.get((item.source, item.reason), ""), ", ".join(keys[:40]), f" and {len(keys) - 40} more" if len(keys) > 40 else "")

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
