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
  the service); a fleet worker acknowledges a job only after these writes were accepted.

The attributes, evaluator span, event and metrics follow :mod:`relevancy_tracer.otel.results`,
the decorator's own writer.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from ..config import Settings
from ..otel import attributes as A
from ..otel.results import emit_evaluator_span, evaluation_event, evaluation_window, outcome_attributes, record_outcome
from ..otel.spans import content_attributes, suppressed_instrumentation
from ..phoenix_annotations import PhoenixClient, annotation_for
from ..result import RelevancyResult, Status
from ..scoring.engine import Engine
from .jobs import ScoreRequest
from .telemetry import ServiceTelemetry

logger = logging.getLogger("relevancy_tracer")


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

    @classmethod
    def for_settings(cls, settings: Settings, telemetry: ServiceTelemetry) -> "Scorer":
        """A scorer for ``settings``, writing Phoenix annotations when ``phoenix_url`` is set
        (what ``serve`` in process and every fleet worker use)."""
        return cls(settings, telemetry, PhoenixClient(settings.phoenix_url) if settings.phoenix_url else None)

    async def score(self, request: ScoreRequest) -> RelevancyResult:
        """Score one request (never raises for model failures: the result says what failed)."""
        with suppressed_instrumentation():
            return await self.engine.ascore(request.question, request.answer, request.contexts, history=request.history, method=request.method, timeout=self.settings.evaluation_timeout)

    def write(self, request: ScoreRequest, result: Optional[RelevancyResult], status: Optional[str] = None, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        """Write one outcome: spans, log record, metrics, annotation (the rules of
        :mod:`relevancy_tracer.otel.results`). Raises PhoenixError when the annotation could not
        be written (the job is then retried, its annotation upserted)."""
        status = status or (Status.SCORED if result is not None and result.ok else Status.ERROR)
        capture = self.settings.capture_content
        limit = self.settings.max_content_chars
        attrs = outcome_attributes(status, result, capture_content=capture, limit=limit, evaluation=request.evaluation_id, error=error, reason=reason)
        parent = SpanContext(int(request.trace_id, 16), int(request.span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        start, now = evaluation_window(result)
        extra: dict[str, Any] = {A.QUEUE_WAIT_MS: max(0.0, (start - request.received_ns) / 1e6), A.EVALUATED_SPAN_NAME: request.span_name}
        if capture:
            extra.update(content_attributes(request.question, request.answer, None, limit))
        emit_evaluator_span(self.telemetry.tracer(request.project), parent, attrs, result, capture_content=capture, window=(start, now), extra=extra)
        if result is not None:
            self.telemetry.logger.emit(
                timestamp=now,
                context=trace.set_span_in_context(NonRecordingSpan(parent)),
                event_name=A.GEN_AI_EVALUATION_RESULT,
                attributes=evaluation_event(result, request.evaluation_id),
            )
        record_outcome(self.telemetry.metrics, request.span_name, attrs, result, service_name=request.service_name)
        if self.phoenix is not None and result is not None and result.ok:
            annotation = annotation_for(result, request.span_id, request.evaluation_id, capture_content=capture)
            if annotation is not None:
                self.phoenix.annotate([annotation], sync=False)  # Phoenix holds it until the span arrives
