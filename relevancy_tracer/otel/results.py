"""Writing an evaluation's outcome where tracing UIs show it: one writer for the decorator's path
(``tracing/job.py``, ``tracing/call.py``) and the scoring service (``service/writer.py``).

An outcome is a status (``scored``, ``error``, ``dropped``, ``timeout``, ``shutdown``, and the
per-call ``not_sampled``, ``skipped``, ``incomplete``, ``cancelled``), the
:class:`~relevancy_tracer.result.RelevancyResult` when the evaluation ran, and else what the
caller knows: an error message, an error type, a reason. The same rules hold on every path:

* ``relevancy.status`` always; ``relevancy.evaluation.id`` on every evaluation's outcome (a hash
  of trace id, span id and method, :func:`evaluation_id`);
* an error is described by its type, ``relevancy.error.type`` (the engine's failure status, or
  the caller's type such as ``internal``); its message, ``relevancy.error``, only with content
  capture on (a message may quote the user's text or the model's reply); an evaluator span's
  status description is the message with capture on, else the type, else the status;
* why a call or evaluation was not scored is ``relevancy.status.reason``;
* the ``gen_ai.evaluation.result`` event carries the evaluation id and evaluator version;
* the ``relevancy.evaluations`` counter gets the status, label, failure kind, reason and error
  type; the score
  and duration histograms every result.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status as SpanStatus, StatusCode

from ..result import RelevancyResult, Status
from . import attributes as A
from .spans import clip, result_attributes


def evaluation_id(trace_id: str, span_id: str, method: str) -> str:
    """The deterministic id of the evaluation of one span by one method: 32 hex digits of
    SHA-256 over ``trace_id:span_id:method`` (hex ids, lowercase). A retried job gets the same
    id, so its annotation is upserted, never doubled."""
    return hashlib.sha256(f"{trace_id.lower()}:{span_id.lower()}:{method}".encode("ascii")).hexdigest()[:32]


def outcome_attributes(
    status: str,
    result: Optional[RelevancyResult] = None,
    *,
    capture_content: bool,
    limit: int,
    evaluation: Optional[str] = None,
    error: Optional[str] = None,
    error_type: Optional[str] = None,
    reason: Optional[str] = None,
) -> dict[str, Any]:
    """The ``relevancy.*`` attributes of an outcome (see the module docstring for the rules).

    Args:
        status: the outcome's status. result: the result, when the evaluation ran.
        capture_content: whether texts (and error messages) may be written. limit: characters
            per text attribute. evaluation: the evaluation id (None for a call that was never
            evaluated). error: a message (written only with capture). error_type: the error's
            type when ``result`` does not give one; ``internal`` for a result-less ``error``.
        reason: why the call was not scored (``relevancy.status.reason``).
    """
    attrs = result_attributes(result, capture_content=capture_content, limit=limit) if result is not None else {}
    attrs[A.STATUS] = status
    if evaluation is not None:
        attrs[A.EVALUATION_ID] = evaluation
    if error and capture_content and A.ERROR not in attrs:
        attrs[A.ERROR] = clip(error, limit)
    if A.ERROR_TYPE not in attrs and (error_type or status == Status.ERROR):
        attrs[A.ERROR_TYPE] = error_type or "internal"
    if reason:
        attrs[A.STATUS_REASON] = reason
    return attrs


_plain_outcomes: dict[str, dict[str, Any]] = {}


def plain_outcome(status: str) -> dict[str, Any]:
    """:func:`outcome_attributes` of ``status`` alone (no result, error, type or reason), built
    once per status: the unsampled call's path writes it on every call. Shared: do not mutate."""
    attrs = _plain_outcomes.get(status)
    if attrs is None:
        attrs = _plain_outcomes[status] = outcome_attributes(status, capture_content=False, limit=0)
    return attrs


def evaluation_event(result: RelevancyResult, evaluation: Optional[str] = None) -> dict[str, Any]:
    """Attributes of the ``gen_ai.evaluation.result`` event (a span event, or the service's log
    record) for ``result``, with the evaluation id and evaluator version."""
    attrs: dict[str, Any] = {A.GEN_AI_EVALUATION_NAME: A.EVALUATION_NAME}
    if result.ok:
        attrs[A.GEN_AI_EVALUATION_SCORE_VALUE] = float(result.score)  # type: ignore[arg-type]
        attrs[A.GEN_AI_EVALUATION_SCORE_LABEL] = result.label
        attrs[A.GEN_AI_EVALUATION_EXPLANATION] = result.explanation
    else:
        attrs["error.type"] = result.status
    if evaluation is not None:
        attrs[A.EVALUATION_ID] = evaluation
    if result.evaluator_version:
        attrs[A.EVALUATOR_VERSION] = result.evaluator_version
    return attrs


def write_on_span(span: Any, attrs: dict[str, Any], result: Optional[RelevancyResult], *, timestamp: int) -> None:
    """Put an outcome on a span still open (the answer span held in ``answer_span`` mode): its
    attributes and, for a result, the ``gen_ai.evaluation.result`` event at ``timestamp``
    (Unix ns)."""
    span.set_attributes(attrs)
    if result is not None:
        span.add_event(A.GEN_AI_EVALUATION_RESULT, evaluation_event(result, attrs.get(A.EVALUATION_ID)), timestamp=timestamp)


def evaluation_window(result: Optional[RelevancyResult]) -> tuple[int, int]:
    """(start, end) in Unix ns of an evaluator span ending now: it lasted the result's latency."""
    now = time.time_ns()
    return now - int((result.latency_ms if result is not None else 0.0) * 1e6), now


def emit_evaluator_span(
    tracer: Any,
    evaluated: SpanContext,
    attrs: dict[str, Any],
    result: Optional[RelevancyResult],
    *,
    capture_content: bool,
    window: Optional[tuple[int, int]] = None,
    extra: Optional[dict[str, Any]] = None,
) -> None:
    """Write an outcome as an OpenInference ``EVALUATOR`` span (``answer_relevancy``), child of
    and linked to the ``evaluated`` span (ended spans are immutable: OpenInference's annotation
    model), with ``attrs`` and ``extra`` (e.g. content attributes), the evaluation event, and an
    OK status when scored, else ERROR described as the module docstring says.

    ``window``: (start, end) Unix ns, default :func:`evaluation_window`.
    """
    start, end = window or evaluation_window(result)
    span = tracer.start_span(
        A.EVALUATION_NAME,
        context=trace.set_span_in_context(NonRecordingSpan(evaluated)),
        kind=SpanKind.INTERNAL,
        links=[Link(evaluated, {"relevancy.link": "evaluated_span"})],
        start_time=start,
        attributes={A.OPENINFERENCE_SPAN_KIND: A.SPAN_KIND_EVALUATOR, **attrs, **(extra or {})},
    )
    if result is not None:
        span.add_event(A.GEN_AI_EVALUATION_RESULT, evaluation_event(result, attrs.get(A.EVALUATION_ID)), timestamp=end)
    status = attrs.get(A.STATUS)
    if status == Status.SCORED:
        span.set_status(SpanStatus(StatusCode.OK))
    else:
        description = attrs.get(A.ERROR) if capture_content else None
        span.set_status(SpanStatus(StatusCode.ERROR, str(description or attrs.get(A.ERROR_TYPE) or status)[:200]))
    span.end(end_time=end)


def record_outcome(metrics: Any, span_name: str, attrs: dict[str, Any], result: Optional[RelevancyResult], *, service_name: Optional[str] = None) -> None:
    """Count an outcome on the ``relevancy.evaluations`` counter (status, label, failure kind,
    reason, error type from ``attrs``) and record a result's score and duration.

    ``metrics``: a :class:`~relevancy_tracer.otel.metrics.RelevancyMetrics`. service_name: the
    scored app's, when it is not the metrics' own (the service).
    """
    status = attrs[A.STATUS]
    label = result.label if result is not None and result.ok else None
    kind = result.failure_kind if result is not None and result.ok else None
    metrics.count(span_name, status, label=label, reason=attrs.get(A.STATUS_REASON), error_type=attrs.get(A.ERROR_TYPE), service_name=service_name, failure_kind=kind)
    if result is not None and result.history_status:
        metrics.count_history(span_name, result.history_status, service_name=service_name)
    if result is not None:
        metrics.record_result(span_name, result.score if result.ok else None, result.latency_ms / 1000.0, result.method, result.evaluator_version, service_name=service_name)
