"""Scoring a request and writing its result where tracing UIs show it.

For every scored span, as the decorator's ``evaluation_span`` mode writes it:

* an OpenInference ``EVALUATOR`` span in the scored span's trace, parented to and linked to it,
  carrying the ``relevancy.*`` attributes and ``relevancy.evaluation.id``, exported under the
  app's Phoenix project;
* the ``gen_ai.evaluation.result`` event as a log record through the OpenTelemetry Logs API,
  with the scored span's trace context (span events are being deprecated in favour of
  log-based events), attributes ``gen_ai.evaluation.name`` / ``.score.value`` / ``.score.label``
  / ``.explanation``;
* the decorator's metrics, with the scored app's ``service.name``;
* optionally a Phoenix span annotation, upserted by evaluation id. Phoenix accepts it before
  answering and holds it until the scored span arrives (the app's exporter may be slower than
  the service); a worker acknowledges a job only after these writes were accepted.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status as SpanStatus, StatusCode, TraceFlags

from ..config import Settings
from ..otel import attributes as A
from ..otel.spans import content_attributes, evaluation_event, result_attributes, suppressed_instrumentation
from ..phoenix_annotations import PhoenixClient, annotation_for
from ..result import RelevancyResult, Status
from ..scoring.engine import Engine
from .jobs import ScoreRequest
from .telemetry import ServiceTelemetry

logger = logging.getLogger("relevancy_tracer")

EVALUATION_ID = "relevancy.evaluation.id"
#: Milliseconds the job waited between the receiver taking the span and its scoring starting.
QUEUE_WAIT_MS = "relevancy.queue.wait_ms"
#: The name of the span this EVALUATOR span scores.
EVALUATED_SPAN_NAME = "relevancy.evaluated_span.name"


class Scorer:
    """Scores :class:`ScoreRequest` s and writes their results (see the module docstring).

    Args:
        settings: models, method, capture, limits (the usual ``RELEVANCY_TRACER_*``).
        telemetry: the providers results go through.
        phoenix: a :class:`PhoenixClient` for annotations, or None.
    """

    def __init__(self, settings: Settings, telemetry: ServiceTelemetry, phoenix: Optional[PhoenixClient] = None):
        self.settings = settings
        self.engine = Engine(settings)
        self.telemetry = telemetry
        self.phoenix = phoenix

    async def score(self, request: ScoreRequest) -> RelevancyResult:
        """Score one request (never raises for model failures: the result says what failed)."""
        with suppressed_instrumentation():
            return await self.engine.ascore(request.question, request.answer, request.contexts, method=request.method, timeout=self.settings.evaluation_timeout)

    def write(self, request: ScoreRequest, result: Optional[RelevancyResult], status: Optional[str] = None, error: Optional[str] = None) -> None:
        """Write one outcome: spans, log record, metrics, annotation. Raises PhoenixError when
        the annotation could not be written (the job is then retried, its annotation upserted)."""
        status = status or (Status.SCORED if result is not None and result.ok else Status.ERROR)
        capture = self.settings.capture_content
        attrs: dict[str, Any] = {}
        if result is not None:
            attrs = result_attributes(result, capture_content=capture, limit=self.settings.max_content_chars)
        attrs[A.STATUS] = status
        attrs[EVALUATION_ID] = request.evaluation_id
        if error and capture and A.ERROR not in attrs:
            attrs[A.ERROR] = error
        if status != Status.SCORED and A.ERROR_TYPE not in attrs:
            attrs[A.ERROR_TYPE] = result.status if result is not None else status
        parent = SpanContext(int(request.trace_id, 16), int(request.span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        now = time.time_ns()
        start = now - int((result.latency_ms if result is not None else 0.0) * 1e6)
        span_attrs = {A.OPENINFERENCE_SPAN_KIND: A.SPAN_KIND_EVALUATOR, **attrs, QUEUE_WAIT_MS: max(0.0, (start - request.received_ns) / 1e6), EVALUATED_SPAN_NAME: request.span_name}
        if capture:
            span_attrs.update(content_attributes(request.question, request.answer, None, self.settings.max_content_chars))
        tracer = self.telemetry.tracer(request.project)
        span = tracer.start_span(
            A.EVALUATION_NAME,
            context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.INTERNAL,
            links=[Link(parent, {"relevancy.link": "evaluated_span"})],
            start_time=start,
            attributes=span_attrs,
        )
        if result is not None:
            span.add_event(A.GEN_AI_EVALUATION_RESULT, evaluation_event(result), timestamp=now)
        span.set_status(SpanStatus(StatusCode.OK) if status == Status.SCORED else SpanStatus(StatusCode.ERROR, str(attrs.get(A.ERROR_TYPE, status))))
        span.end(end_time=now)
        if result is not None:
            event_attrs = dict(evaluation_event(result))
            event_attrs[EVALUATION_ID] = request.evaluation_id
            if result.evaluator_version:
                event_attrs[A.EVALUATOR_VERSION] = result.evaluator_version
            self.telemetry.logger.emit(
                timestamp=now,
                context=trace.set_span_in_context(NonRecordingSpan(parent)),
                event_name=A.GEN_AI_EVALUATION_RESULT,
                attributes=event_attrs,
            )
        metrics = self.telemetry.metrics
        label = result.label if result is not None and result.ok else None
        metrics.count(request.span_name, status, label=label, error_type=None if status == Status.SCORED else attrs.get(A.ERROR_TYPE), service_name=request.service_name)
        if result is not None:
            metrics.record_result(request.span_name, result.score if result.ok else None, result.latency_ms / 1000.0, result.method, result.evaluator_version, service_name=request.service_name)
        if self.phoenix is not None and result is not None and result.ok:
            annotation = annotation_for(result, request.span_id, request.evaluation_id, capture_content=capture)
            if annotation is not None:
                self.phoenix.annotate([annotation], sync=False)  # Phoenix holds it until the span arrives
