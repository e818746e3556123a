"""OpenTelemetry metrics of the tracer, through the metrics API (works under any MeterProvider).

Instruments (meter ``relevancy_tracer``):

* ``relevancy.score`` (histogram, unit ``1``): scores of scored evaluations, explicit buckets
  0, 0.1, ..., 1.0 (an advisory honoured by the SDK, and a View when this library installs the
  MeterProvider), so alert rules can compute means and low-score shares.
* ``relevancy.evaluations`` (counter, ``{evaluation}``): calls by ``relevancy.status``, with
  ``relevancy.label`` and ``relevancy.failure_kind`` (below ``directly_addresses``) for scored
  ones, ``relevancy.status.reason`` for drops and skips, and
  ``relevancy.error.type`` for errors. Counted in process memory on the hot path and reported
  by an observable counter, so counting a call costs a dict update, not an SDK aggregation.
* ``relevancy.evaluation.duration`` (histogram, ``s``): wall-clock time of each evaluation.
* ``relevancy.history`` (counter, ``{evaluation}``): evaluations that came with a conversation,
  by ``relevancy.history.status``: ``read``, or ``invalid`` (a history of no known shape: the
  call was judged as single-turn).
* ``relevancy.queue.depth`` (observable gauge, ``{evaluation}``): evaluations queued or running.
* ``relevancy.admission.ratio`` (observable gauge, ``1``): the effective sample ratio of
  admission by capacity, the share of sampled calls admitted (1 while the scorer keeps up;
  the rest end with status ``capacity``).
* ``relevancy.admission.capacity`` (observable gauge, ``{evaluation}/s``): the scorer's
  measured capacity (absent until an evaluation finished).

Every point carries ``span.name`` (the traced function's span) and ``service.name``; score and
duration points also ``relevancy.method`` and ``relevancy.evaluator.version``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Optional

from opentelemetry import metrics

from .._background import fork as _fork
from . import attributes as A


class RelevancyMetrics:
    """Records the tracer's metrics.

    Args:
        service_name: value of the ``service.name`` attribute on every point.
        queue_depth: callable returning the current queue depth (evaluations).
        meter_provider: provider to use (default: the global one, resolved lazily).
    """

    def __init__(self, service_name: str, queue_depth: Callable[[], int], meter_provider: Optional[Any] = None):
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("relevancy_tracer")
        self.service_name = service_name
        self._queue_depth = queue_depth
        self._counts: dict[tuple, int] = {}
        #: the admission controller whose ratio and capacity are reported (``ratio`` and
        #: ``rate`` attributes, e.g. a :class:`~relevancy_tracer._background.capacity.Capacity`)
        self.admission: Optional[Any] = None
        self._lock = threading.Lock()
        _fork.renew_after_fork(self, RelevancyMetrics._renew_after_fork)
        self.score = meter.create_histogram(
            A.METRIC_SCORE,
            unit="1",
            description="Answer-relevancy score of scored evaluations",
            explicit_bucket_boundaries_advisory=list(A.SCORE_BUCKETS),
        )
        self.duration = meter.create_histogram(
            A.METRIC_DURATION,
            unit="s",
            description="Wall-clock duration of one relevancy evaluation",
            explicit_bucket_boundaries_advisory=list(A.DURATION_BUCKETS),
        )
        meter.create_observable_counter(
            A.METRIC_EVALUATIONS,
            callbacks=[self._observe_counts],
            unit="{evaluation}",
            description="Traced calls by relevancy status (scored, not_sampled, dropped, capacity, error, timeout, shutdown, skipped)",
        )
        self.history = meter.create_counter(
            A.METRIC_HISTORY,
            unit="{evaluation}",
            description="Evaluations that came with a conversation, by relevancy.history.status (read, or invalid: judged as single-turn)",
        )
        meter.create_observable_gauge(
            A.METRIC_QUEUE_DEPTH,
            callbacks=[self._observe_depth],
            unit="{evaluation}",
            description="Evaluations queued or running in the background job queue",
        )

        meter.create_observable_gauge(
            A.METRIC_SAMPLE_RATIO,
            callbacks=[self._observe_ratio],
            unit="1",
            description="Effective sample ratio of admission by capacity: the share of sampled calls the scorer can finish in time (the rest end with status capacity)",
        )
        meter.create_observable_gauge(
            A.METRIC_CAPACITY,
            callbacks=[self._observe_capacity],
            unit="{evaluation}/s",
            description="Evaluations per second the scorer finishes with every slot busy, as measured",
        )

    def _observe_ratio(self, _options: Any) -> Iterable[metrics.Observation]:
        admission = self.admission
        if admission is not None:
            yield metrics.Observation(float(admission.ratio), {A.ATTR_SERVICE_NAME: self.service_name})

    def _observe_capacity(self, _options: Any) -> Iterable[metrics.Observation]:
        admission = self.admission
        rate = admission.rate if admission is not None else None
        if rate is not None:
            yield metrics.Observation(float(rate), {A.ATTR_SERVICE_NAME: self.service_name})

    def _renew_after_fork(self) -> None:
        self._lock = threading.Lock()

    def count(self, span_name: str, status: str, label: Optional[str] = None, reason: Optional[str] = None, error_type: Optional[str] = None, service_name: Optional[str] = None, failure_kind: Optional[str] = None) -> None:
        """Count one call with its final relevancy status (cheap: no SDK call).

        ``service_name`` overrides the instance's (the scoring service counts per scored app).
        ``failure_kind``: a scored answer's (one of seven, so the counter's series stay few)."""
        key = (span_name, status, label, reason, error_type, service_name or self.service_name, failure_kind)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def record_result(self, span_name: str, score: Optional[float], duration_s: Optional[float], method: str, evaluator_version: Optional[str] = None, service_name: Optional[str] = None) -> None:
        """Record a scored evaluation's score and an evaluation's duration.

        ``evaluator_version`` labels the points, so dashboards and alert rules compare scores of
        one evaluator only (an evaluator change is not app drift).
        """
        attrs = {A.ATTR_SPAN_NAME: span_name, A.ATTR_SERVICE_NAME: service_name or self.service_name, A.METHOD: method}
        if evaluator_version:
            attrs[A.EVALUATOR_VERSION] = evaluator_version
        if score is not None:
            self.score.record(score, attrs)
        if duration_s is not None:
            self.duration.record(duration_s, attrs)

    def count_history(self, span_name: str, status: str, service_name: Optional[str] = None) -> None:
        """Count one evaluation that came with a conversation, by its ``history_status``."""
        self.history.add(1, {A.ATTR_SPAN_NAME: span_name, A.ATTR_SERVICE_NAME: service_name or self.service_name, A.HISTORY_STATUS: status})

    def counts(self) -> dict[tuple, int]:
        """A copy of the cumulative counts, keyed (span_name, status, label, reason, error_type,
        service_name, failure_kind)."""
        with self._lock:
            return dict(self._counts)

    def _observe_counts(self, _options: Any) -> Iterable[metrics.Observation]:
        for (span_name, status, label, reason, error_type, service_name, failure_kind), value in self.counts().items():
            attrs = {A.ATTR_SPAN_NAME: span_name, A.ATTR_SERVICE_NAME: service_name, A.STATUS: status}
            if label:
                attrs[A.LABEL] = label
            if failure_kind:
                attrs[A.FAILURE_KIND] = failure_kind
            if reason:
                attrs[A.STATUS_REASON] = reason
            if error_type:
                attrs[A.ERROR_TYPE] = error_type
            yield metrics.Observation(value, attrs)

    def _observe_depth(self, _options: Any) -> Iterable[metrics.Observation]:
        try:
            depth = int(self._queue_depth())
        except Exception:
            return
        yield metrics.Observation(depth, {A.ATTR_SERVICE_NAME: self.service_name})


_shared: Optional[RelevancyMetrics] = None
_shared_lock = threading.Lock()


@_fork.after_fork
def _renew_shared_lock() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()


def shared_metrics(service_name: str, queue_depth: Callable[[], int]) -> RelevancyMetrics:
    """The process-wide instruments on the global MeterProvider.

    Created once: observable instruments cannot be registered twice, and cumulative counts
    must survive ``configure()`` being called again. Each call points the queue-depth gauge at
    ``queue_depth`` (the newest runtime's queue; the previous one is shut down).
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RelevancyMetrics(service_name, queue_depth)
        else:
            _shared._queue_depth = queue_depth
        return _shared


def score_views() -> list:
    """SDK Views giving ``relevancy.score`` and ``relevancy.evaluation.duration`` their buckets
    (for MeterProviders this library creates; the advisory covers the others)."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    return [
        View(instrument_name=A.METRIC_SCORE, aggregation=ExplicitBucketHistogramAggregation(list(A.SCORE_BUCKETS))),
        View(instrument_name=A.METRIC_DURATION, aggregation=ExplicitBucketHistogramAggregation(list(A.DURATION_BUCKETS))),
    ]
