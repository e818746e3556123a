"""``relevancy-tracer serve`` and ``relevancy-tracer worker``: scoring spans of apps that never
import this package.

* :class:`ScoringService` receives OTLP traces (``receiver.py``), selects the spans to score
  (``selection.py``: OpenInference and GenAI attributes, filters, the decorator's samplers) and
  queues one :class:`~relevancy_tracer.service.jobs.ScoreRequest` per span, a whole export
  request or nothing: in process (the decorator's bounded :class:`~relevancy_tracer.worker.Worker`,
  the default), or on a Redis Stream (``--queue redis://...``) for a fleet. A full queue refuses
  the request with OTLP's retryable codes, so the exporter re-sends it.
* :class:`FleetWorker` consumes the stream as one consumer of the group: reclaims jobs of dead
  consumers first (``XAUTOCLAIM``), skips jobs already done (a re-sent or reclaimed job whose
  evaluation id is recorded), scores, writes (``writer.py``), force-flushes the exporters, and
  only then acknowledges.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Optional

from ..config import Settings
from ..phoenix import PhoenixClient
from ..result import Status
from ..worker import Worker
from .jobs import ScoreRequest
from .otlp import spans_of
from .receiver import DrainRate, OTLPServer
from .selection import Selection, SpanSelector
from .telemetry import ServiceTelemetry
from .writer import Scorer

logger = logging.getLogger("relevancy_tracer")


class ServiceJob:
    """One in-process evaluation (the :class:`~relevancy_tracer.worker.Job` protocol)."""

    def __init__(self, scorer: Scorer, request: ScoreRequest, timeout: float, hold: float, drain: DrainRate):
        self.scorer = scorer
        self.request = request
        self.timeout = timeout
        self.deadline = time.monotonic() + hold
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
                self.scorer.write(self.request, None, status=status, error=error)
            except Exception:
                logger.warning("relevancy-tracer: writing the %s outcome of %s failed", status, self.request.evaluation_id, exc_info=True)
            self._drain.done()


class ScoringService:
    """The OTLP receiver with its queue and, in process, its scorers.

    Args:
        settings: models, method, capture, ``concurrency``, ``queue_size``,
            ``evaluation_timeout``, ``hold_timeout``, ``phoenix_url`` (default: from the
            environment).
        selection: which spans to score (default: OpenInference CHAIN/AGENT/LLM and GenAI spans,
            outermost per trace, the settings' ``sample_ratio`` and ``rate_limit``).
        queue_url: ``redis://host:port/db`` to queue on a Redis Stream for a fleet of
            :class:`FleetWorker`; None to score in this process.
        host, http_port, grpc_port: where to listen (0: a free port; None: protocol off).

    Raises:
        OSError: from :meth:`start` when a port is taken.
    """

    def __init__(self, settings: Optional[Settings] = None, *, selection: Optional[Selection] = None, queue_url: Optional[str] = None, host: str = "127.0.0.1", http_port: Optional[int] = 4318, grpc_port: Optional[int] = 4317):
        self.settings = settings or Settings.resolve()
        s = self.settings
        self.selector = SpanSelector(selection or Selection(sample_ratio=s.sample_ratio, rate_limit=s.rate_limit, max_contexts=s.max_contexts, max_context_chars=s.max_context_chars))
        self.drain = DrainRate()
        self.queue: Any = None
        self.worker: Optional[Worker] = None
        if queue_url:
            from .queue import RedisStreamQueue

            self.queue = RedisStreamQueue(queue_url, max_length=s.queue_size)
            depth = self.queue.depth
        else:
            self.worker = Worker(queue_size=s.queue_size, concurrency=s.concurrency, name="relevancy-tracer-service")
            depth = lambda: self.worker.depth  # noqa: E731
        self.telemetry = ServiceTelemetry(queue_depth=depth)
        self.scorer = None if self.queue is not None else Scorer(s, self.telemetry, PhoenixClient(s.phoenix_url) if s.phoenix_url else None)
        self.server = OTLPServer(self.accept, host=host, http_port=http_port, grpc_port=grpc_port, retry_after=self._retry_after, on_refusal=self._refused)
        self.accepted = 0
        self.refused = 0

    def start(self) -> "ScoringService":
        self.server.start()
        logger.info("relevancy-tracer serve: OTLP/HTTP on %s:%s, OTLP/gRPC on %s:%s, queue %s", self.server.host, self.server.http_port, self.server.host, self.server.grpc_port, "redis" if self.queue is not None else "in-process")
        return self

    def accept(self, request: Any) -> bool:
        """Queue the request's selected spans, all or none; False refuses it (retryable)."""
        candidates = self.selector.select(spans_of(request))
        s = self.settings
        requests = [ScoreRequest.from_candidate(c, s.method, s.max_question_chars, s.max_answer_chars) for c in candidates]
        if not requests:
            return True
        if self.queue is not None:
            try:
                ok = self.queue.offer(requests)
            except Exception:  # Redis down: refuse (retryable) rather than lose the spans
                logger.warning("relevancy-tracer: queueing on Redis failed", exc_info=True)
                ok = False
        else:
            assert self.worker is not None and self.scorer is not None
            ok = self.worker.submit_all([ServiceJob(self.scorer, r, s.evaluation_timeout, s.hold_timeout, self.drain) for r in requests])
        if ok:
            self.accepted += len(requests)
        return ok

    def _retry_after(self) -> int:
        try:
            backlog = self.queue.depth() if self.queue is not None else (self.worker.depth if self.worker else 0)
        except Exception:
            backlog = 0
        return self.drain.retry_after(backlog)

    def _refused(self, protocol: str) -> None:
        self.refused += 1
        self.telemetry.refused.add(1, {"rpc.system": "grpc" if protocol == "grpc" else "http"})

    def flush(self, timeout: float = 30.0) -> bool:
        """In process: wait until every queued evaluation was written, then export."""
        deadline = time.monotonic() + timeout
        ok = self.worker.flush(timeout) if self.worker is not None else True
        return self.telemetry.force_flush(max(0.0, deadline - time.monotonic())) and ok

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop receiving, finish (in process) what is queued within ``timeout``, export, close."""
        deadline = time.monotonic() + timeout
        self.server.stop(grace=min(2.0, timeout))
        ok = True
        if self.worker is not None:
            ok = self.worker.shutdown(max(0.0, deadline - time.monotonic()))
        if self.queue is not None:
            self.queue.close()
        return self.telemetry.shutdown(max(0.0, deadline - time.monotonic())) and ok


class FleetWorker:
    """A consumer of the Redis Stream: scores jobs and acknowledges them once exported.

    Args:
        queue_url: the stream's Redis. settings: as for :class:`ScoringService`
            (``concurrency`` jobs are taken and scored at once). claim_idle: seconds after which
            a job taken by a consumer that never acknowledged it is reclaimed.

    Attributes:
        scored, skipped, reclaimed, failed: job counts (skipped: already done).
    """

    def __init__(self, queue_url: str, settings: Optional[Settings] = None, *, claim_idle: float = 30.0, consumer: Optional[str] = None):
        from .queue import RedisStreamQueue, consumer_name

        self.settings = settings or Settings.resolve()
        self.queue = RedisStreamQueue(queue_url, max_length=self.settings.queue_size, claim_idle=claim_idle)
        self.consumer = consumer or consumer_name()
        self.telemetry = ServiceTelemetry(queue_depth=self.queue.depth)
        phoenix = PhoenixClient(self.settings.phoenix_url) if self.settings.phoenix_url else None
        self.scorer = Scorer(self.settings, self.telemetry, phoenix)
        self.scored = self.skipped = self.reclaimed = self.failed = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the jobs in hand (call from a signal handler)."""
        self._stop.set()

    def run(self, max_jobs: Optional[int] = None) -> None:
        """Consume until :meth:`stop` (or ``max_jobs`` jobs handled)."""
        loop = asyncio.new_event_loop()
        try:
            handled = 0
            while not self._stop.is_set() and (max_jobs is None or handled < max_jobs):
                try:
                    handled += loop.run_until_complete(self.step())
                except Exception:  # Redis unreachable for a moment: retry, never crash the worker
                    logger.warning("relevancy-tracer worker: a step failed; retrying", exc_info=True)
                    self._stop.wait(1.0)
        finally:
            loop.close()
            self.telemetry.shutdown(10.0)
            self.queue.close()

    async def step(self, block_ms: int = 500) -> int:
        """Take up to ``concurrency`` jobs (reclaimed ones first), score and acknowledge them;
        returns how many were handled."""
        count = max(1, self.settings.concurrency)
        entries = self.queue.reclaim(self.consumer, count)
        if entries:
            self.reclaimed += len(entries)
            self.telemetry.reclaimed.add(len(entries))
        else:
            entries = await asyncio.to_thread(self.queue.read, self.consumer, count, block_ms)
        todo = []
        for entry_id, request in entries:
            if request is None or self.queue.is_done(request.evaluation_id):
                self.skipped += 1
                self.queue.ack(entry_id)
            else:
                todo.append((entry_id, request))
        if not todo:
            return len(entries)
        results = await asyncio.gather(*(self.scorer.score(r) for _, r in todo))
        written = []
        for (entry_id, request), result in zip(todo, results):
            try:
                await asyncio.to_thread(self.scorer.write, request, result)
            except Exception:  # left unacknowledged: reclaimed and retried (its annotation upserted)
                self.failed += 1
                logger.warning("relevancy-tracer worker: writing %s failed; it will be retried", request.evaluation_id, exc_info=True)
                continue
            written.append((entry_id, request, result))
        if written and not await asyncio.to_thread(self.telemetry.force_flush, 30.0):
            self.failed += len(written)
            logger.warning("relevancy-tracer worker: the exporters did not flush; %d jobs left for retry", len(written))
            return len(entries)
        for entry_id, request, result in written:
            self.queue.ack(entry_id, request.evaluation_id)
            if result.status == Status.SCORED:
                self.scored += 1
            else:
                self.failed += 1
        return len(entries)
