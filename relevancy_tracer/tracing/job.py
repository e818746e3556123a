"""The per-evaluation job: score one sampled call in the job queue and write the result
(through :mod:`relevancy_tracer.otel.results`).

Where a result goes (setting ``attach``):

* ``answer_span``: the answer span was held open after the function returned, its end time
  recorded; the job sets the ``relevancy.*`` attributes and a ``gen_ai.evaluation.result`` event
  and ends it with that end time (``Span.end(end_time=...)``). Dropped, shed (``capacity``),
  failed, timed out or shut-down evaluations end it with ``relevancy.status`` saying why. The
  span is held for at most ``hold_timeout`` (the job's deadline): an evaluation still running
  or queued then is *deferred*, not thrown away (a queued one when it can still be scored
  within ``evaluation_timeout`` of the call; otherwise it ends ``capacity`` there): the answer span ends with status ``deferred`` (reason
  ``hold_timeout``, and the ``relevancy.evaluation.id`` of the result to come), and the
  result, when it comes, goes on an EVALUATOR span child of and linked to it, as in
  ``evaluation_span`` mode.
* ``evaluation_span``: the answer span ended normally; the job emits an OpenInference EVALUATOR
  span, child of and linked to it, with the same attributes and event (OpenInference's
  annotation model: ended spans are immutable).

Then, for every final outcome (a deferral is not one: the call is counted once, when its
result is written): the metrics (count by status, score and duration by evaluator
version), the drift detector (per traced function and evaluator version), and the ``on_result``
hook. With content capture off nothing derived from the user's text leaves the job: no texts,
no generated questions, no error messages (type and status only), and the hook receives the
result without its texts.

A job finishes exactly once (a lock guards it): the job queue may finish it (dropped, timeout,
shutdown) while it runs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .._logging import log_failure
from ..otel import attributes as A
from ..otel.results import emit_evaluator_span, evaluation_id, outcome_attributes, record_outcome, write_on_span
from ..otel.spans import content_attributes, suppressed_instrumentation
from ..result import RelevancyResult, Status

if TYPE_CHECKING:  # pragma: no cover
    from .runtime import Runtime

logger = logging.getLogger("relevancy_tracer")


@dataclass(frozen=True)
class EvaluationOutcome:
    """What the ``on_result`` hook receives when a sampled call's evaluation ends.

    Attributes:
        span_name: the traced function's span. status: scored | error | dropped | capacity |
            timeout | shutdown. result: the :class:`RelevancyResult` (None when the evaluation never ran:
            dropped, timed out, shut down); without content capture, its texts are removed
            (:meth:`RelevancyResult.without_content`). trace_id, span_id: of the answer span, as
            32 / 16 lowercase hex digits (e.g. for a link into the tracing UI).
        question, answer: the texts that were scored (None when ``capture_content`` is off).
    """

    span_name: str
    status: str
    result: Optional[RelevancyResult]
    trace_id: str
    span_id: str
    question: Optional[str] = None
    answer: Optional[str] = None


class EvaluationJob:
    """One sampled call's evaluation, run by the job queue; finishes its span exactly once.

    Args:
        runtime: the tracer's runtime (settings, engine, tracer, metrics, drift, annotations).
        span: the call's span (held open in ``answer_span`` mode, ended otherwise).
        span_name: the traced function's span name. overrides: its per-function evaluation
            settings. question, answer, contexts: the texts, already extracted and redacted.
        end_time: when the call ended (Unix ns).

    Holds the texts truncated to the scoring budgets (one character more, so the engine still
    reports ``truncated``): a full queue holds bounded memory.
    """

    __slots__ = ("runtime", "span", "span_name", "overrides", "question", "answer", "contexts", "history", "end_time", "deadline", "deadline_name", "deadline_limit", "due", "due_name", "due_limit", "timeout", "deferrable", "trace_id", "span_context", "method", "_lock", "_done", "_deferred")

    def __init__(self, runtime: "Runtime", span: Any, span_name: str, overrides: dict, question: str, answer: str, contexts: Optional[list[str]], end_time: int, history: Any = None):
        self.runtime = runtime
        self.span = span
        self.span_name = span_name
        self.overrides = overrides
        settings = runtime.settings
        self.question = question[: settings.max_question_chars + 1] if isinstance(question, str) else question
        self.answer = answer[: settings.max_answer_chars + 1] if isinstance(answer, str) else answer
        self.contexts = contexts
        self.history = history  # a bounded conversation.History (or None): the earlier turns
        self.end_time = end_time
        # the result is due by the end of the answer span's hold, or, on an evaluation span,
        # within evaluation_timeout of the call
        self.deferrable = settings.attach == "answer_span"
        self.deadline_name = "hold_timeout" if self.deferrable else "evaluation_timeout"
        self.deadline_limit = settings.hold_timeout if self.deferrable else settings.evaluation_timeout
        submitted = time.monotonic()
        self.deadline = submitted + self.deadline_limit
        # a deferred result (on the EVALUATOR span) is still useful within evaluation_timeout
        # of the call: a queued job is started until then
        self.due_name, self.due_limit = ("evaluation_timeout", settings.evaluation_timeout) if settings.evaluation_timeout >= self.deadline_limit else (self.deadline_name, self.deadline_limit)
        self.due = submitted + self.due_limit
        self.timeout = settings.evaluation_timeout
        self.span_context = span.get_span_context()
        self.trace_id = self.span_context.trace_id
        self.method = overrides.get("method", settings.method)
        self._lock = threading.Lock()
        self._done = False
        self._deferred = False

    async def run(self) -> None:
        with suppressed_instrumentation():
            result = await self.runtime.engine.ascore(self.question, self.answer, self.contexts, history=self.history, **self.overrides)
        if result.ok:
            self._complete(Status.SCORED, result=result)
        else:
            self._complete(Status.ERROR, result=result, error=result.error, error_type=result.status)

    def finish(self, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        """Outcomes decided by the job queue: dropped, capacity, timeout, shutdown, error."""
        self._complete(status, error=error, reason=reason, error_type="internal" if status == Status.ERROR else None)

    def defer(self) -> None:
        """The answer span's hold ended while the evaluation runs or waits: end the answer span with
        status ``deferred`` (reason ``hold_timeout``, and the evaluation id its result will
        carry); the result goes on a linked EVALUATOR span when it comes."""
        with self._lock:
            if self._done or self._deferred or self.runtime.settings.attach != "answer_span":
                return
            self._deferred = True
        settings = self.runtime.settings
        trace_hex, span_hex = format(self.span_context.trace_id, "032x"), format(self.span_context.span_id, "016x")
        try:
            attrs = outcome_attributes(Status.DEFERRED, capture_content=settings.capture_content, limit=settings.max_content_chars, evaluation=evaluation_id(trace_hex, span_hex, self.method), error=f"no result within hold_timeout ({settings.hold_timeout:g} s): it goes on the EVALUATOR span linked to this span", reason="hold_timeout")
            write_on_span(self.span, attrs, None, timestamp=self.end_time)
        except Exception:
            log_failure("writing a deferral failed", settings.capture_content)
        try:
            self.span.end(end_time=self.end_time)
        except Exception:
            pass

    def _complete(self, status: str, *, result: Optional[RelevancyResult] = None, error: Optional[str] = None, reason: Optional[str] = None, error_type: Optional[str] = None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            deferred = self._deferred
        runtime, span = self.runtime, self.span
        settings = runtime.settings
        capture = settings.capture_content
        name = self.span_name
        trace_hex, span_hex = format(self.span_context.trace_id, "032x"), format(self.span_context.span_id, "016x")
        identifier = evaluation_id(trace_hex, span_hex, result.method if result is not None else self.method)
        attrs: dict[str, Any] = {A.STATUS: status}
        on_answer_span = settings.attach == "answer_span" and not deferred
        try:
            attrs = outcome_attributes(status, result, capture_content=capture, limit=settings.max_content_chars, evaluation=identifier, error=error, error_type=error_type, reason=reason or ("hold_timeout" if deferred else None))
            if on_answer_span or (status in (Status.DROPPED, Status.CAPACITY) and not deferred and span.is_recording()):
                write_on_span(span, attrs, result, timestamp=self.end_time)
                if on_answer_span:
                    span.end(end_time=self.end_time)
            else:
                content = content_attributes(self.question, self.answer, None, settings.max_content_chars) if capture else None
                emit_evaluator_span(runtime.otel_tracer, self.span_context, attrs, result, capture_content=capture, extra=content)
        except Exception:
            log_failure("writing a result failed", capture)
            if on_answer_span:
                try:
                    span.end(end_time=self.end_time)
                except Exception:
                    pass
        if result is not None and result.ok and runtime.annotations is not None:
            try:
                from ..phoenix_annotations import annotation_for

                annotation = annotation_for(result if capture else result.without_content(), span_hex, identifier, capture_content=capture)
                if annotation is not None:
                    runtime.annotations.submit(annotation)
            except Exception:
                log_failure("queueing a Phoenix annotation failed", capture)
        try:
            record_outcome(runtime.metrics, name, attrs, result)
            if result is not None and result.ok and runtime.drift is not None:
                runtime.drift.observe(name, float(result.score), evaluator_version=result.evaluator_version)  # type: ignore[arg-type]
        except Exception:
            log_failure("recording metrics failed", capture)
        hook = settings.on_result
        if hook is not None:
            try:
                shown = result if (result is None or capture) else result.without_content()
                hook(EvaluationOutcome(name, status, shown, trace_hex, span_hex, self.question if capture else None, self.answer if capture else None))
            except Exception:
                log_failure("the on_result hook raised", capture)
