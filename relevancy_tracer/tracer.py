"""The tracer runtime: per-call spans, sampling, the worker, results on spans, metrics.

One :class:`Tracer` is current per process (``configure()`` replaces it). The decorator calls
:meth:`Tracer.begin` before the app's function and :meth:`CallState.succeed` /
:meth:`CallState.fail` after it. Everything here sits in ``try/except Exception``: a failure of
the tracer is logged, counted (status ``error``) and never reaches the app.

Where a result goes (setting ``attach``):

* ``answer_span``: the answer span is held open after the function returns, its end time
  recorded; the worker sets the ``relevancy.*`` attributes and a ``gen_ai.evaluation.result``
  event and ends it with that end time (``Span.end(end_time=...)``). Unsampled, dropped, failed,
  timed out or shut-down evaluations end it at once with ``relevancy.status`` saying why.
* ``evaluation_span``: the answer span ends normally; the worker emits an OpenInference
  EVALUATOR span, child of and linked to it, carrying the same attributes and event
  (OpenInference's annotation model: ended spans are immutable).

Every span ends exactly once: ending goes through one guarded method per call or job.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, Status as SpanStatus, StatusCode

from . import runtime
from .config import Settings
from .extraction import CallInfo, ExtractionError, Extractor
from .otel import attributes as A
from .otel.metrics import shared_metrics
from .otel.setup import OwnedProviders, install_providers, service_name
from .otel.spans import content_attributes, evaluation_event, result_attributes, suppressed_instrumentation
from .result import RelevancyResult, Status
from .sampling import TRACE_ID_SAMPLERS, SamplingContext, build_sampler
from .scoring.engine import Engine
from .worker import Worker

logger = logging.getLogger("relevancy_tracer")

#: Settings a decorated function may override for its own evaluations.
EVALUATION_OVERRIDES = (
    "method",
    "strictness",
    "noncommittal",
    "generation",
    "thresholds",
    "combined_weights",
    "temperature",
    "max_answer_chars",
    "max_question_chars",
    "json_retries",
)


@dataclass(frozen=True)
class EvaluationOutcome:
    """What the ``on_result`` hook receives when a sampled call's evaluation ends.

    Attributes:
        span_name: the traced function's span. status: scored | error | dropped | timeout |
            shutdown. result: the :class:`RelevancyResult` (None when the evaluation never ran:
            dropped, timed out, shut down). trace_id, span_id: of the answer span, as 32 / 16
            lowercase hex digits (e.g. for a link into the tracing UI).
        question, answer: the texts that were scored (None when ``capture_content`` is off).
    """

    span_name: str
    status: str
    result: Optional[RelevancyResult]
    trace_id: str
    span_id: str
    question: Optional[str] = None
    answer: Optional[str] = None


class TraceOptions:
    """Per-decoration options: span name, extraction rules, evaluation overrides."""

    __slots__ = ("name", "extractor", "overrides", "bound")

    def __init__(self, name: str, extractor: Extractor, overrides: dict, bound: bool):
        self.name = name
        self.extractor = extractor
        self.overrides = overrides
        self.bound = bound  # the decorated callable is a bound method (args exclude self)


class Tracer:
    """Settings, engine, sampler, worker, metrics and OpenTelemetry tracer of the process.

    Build it with :func:`configure` (or implicitly on the first traced call). Args:
        settings: resolved settings. engine: scoring engine (default: the runtime's).
        owned: providers this library installed, shut down with the tracer.
    """

    def __init__(self, settings: Settings, engine: Optional[Engine] = None, owned: Optional[OwnedProviders] = None):
        from . import __version__

        self.settings = settings
        self.enabled = settings.enabled
        self.engine = engine or Engine(settings)
        self.sampler = build_sampler(settings.sample_ratio, settings.rate_limit, settings.sampler)
        self.worker = Worker(queue_size=settings.queue_size, concurrency=settings.concurrency)
        self.otel_tracer = trace.get_tracer("relevancy_tracer", __version__)
        self.owned = owned or OwnedProviders()
        self.service_name = service_name()
        self.metrics = shared_metrics(self.service_name, _current_depth)
        self.drift = None
        if settings.drift_detection:
            try:
                from .drift import DriftMonitor

                self.drift = DriftMonitor(service_name=self.service_name)
            except Exception:  # the monitor is optional; the tracer works without it
                logger.exception("relevancy-tracer: drift detector disabled")

    # ------------------------------------------------------------------ per call

    def begin(self, options: TraceOptions) -> Optional["CallState"]:
        """Start the call's span and make it current. None when tracing is off or this failed."""
        if not self.enabled:
            return None
        try:
            span = self.otel_tracer.start_span(options.name, kind=SpanKind.INTERNAL, attributes={A.OPENINFERENCE_SPAN_KIND: A.SPAN_KIND_CHAIN})
            token = otel_context.attach(trace.set_span_in_context(span))
            return CallState(self, options, span, token)
        except Exception:
            logger.exception("relevancy-tracer: could not start a span")
            return None

    def apply_redaction(self, question: Optional[str], answer: Optional[str], contexts: Optional[list[str]]) -> tuple:
        redact = self.settings.redact
        if redact is None:
            return question, answer, contexts
        return (
            redact(question, "question") if question is not None else None,
            redact(answer, "answer") if answer is not None else None,
            [redact(c, "context") for c in contexts] if contexts is not None else None,
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for pending evaluations, then flush the providers; True when all of it finished."""
        deadline = time.monotonic() + timeout
        ok = self.worker.flush(timeout)
        for provider in (trace.get_tracer_provider(), self._meter_provider()):
            force_flush = getattr(provider, "force_flush", None)
            if callable(force_flush):
                try:
                    result = force_flush(int(max(0.0, deadline - time.monotonic()) * 1000))
                    ok = ok and result is not False
                except Exception:
                    logger.exception("relevancy-tracer: force_flush failed")
                    ok = False
        return ok

    def shutdown(self, timeout: float = 30.0) -> bool:
        """Finish or cancel pending evaluations (ending every held span), then shut down the
        providers this library installed. True when everything finished in time."""
        deadline = time.monotonic() + timeout
        ok = self.worker.shutdown(timeout)
        if self.owned.tracer_provider is not None or self.owned.meter_provider is not None:
            ok = self.owned.force_flush(max(0.0, deadline - time.monotonic())) and ok
            self.owned.shutdown()
        return ok

    @staticmethod
    def _meter_provider() -> Any:
        from opentelemetry import metrics

        return metrics.get_meter_provider()


class CallState:
    """One traced call in flight: its span, context token and end-of-call handling."""

    __slots__ = ("tracer", "options", "span", "token", "chunks", "chunk_chars", "truncated", "_ended")

    def __init__(self, tracer: Tracer, options: TraceOptions, span: Any, token: Any):
        self.tracer = tracer
        self.options = options
        self.span = span
        self.token = token
        self.chunks: Optional[list[str]] = None
        self.chunk_chars = 0
        self.truncated = False
        self._ended = False

    def detach(self) -> None:
        if self.token is not None:
            try:
                otel_context.detach(self.token)
            except Exception:
                pass
            self.token = None

    # -- streams
    def add_chunk(self, text: str) -> None:
        """Accumulate a streamed chunk's text, up to the answer budget (memory stays bounded)."""
        try:
            if self.chunks is None:
                self.chunks = []
            budget = self.tracer.settings.max_answer_chars - self.chunk_chars
            if budget <= 0:
                self.truncated = self.truncated or bool(text)
                return
            piece = text[:budget]
            self.truncated = self.truncated or len(piece) < len(text)
            self.chunks.append(piece)
            self.chunk_chars += len(piece)
        except Exception:
            pass

    # -- outcomes
    def fail(self, exc: BaseException) -> None:
        """The app raised: record the exception, status ERROR, end the span (nothing to score)."""
        self.detach()
        try:
            self.span.record_exception(exc)
            self.span.set_status(SpanStatus(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            self._end_now(Status.SKIPPED, "the call raised; nothing to score")
        except Exception:
            logger.exception("relevancy-tracer: recording an exception failed")

    def abandon(self) -> None:
        """A stream that was never consumed to the end nor closed (collected): end the span."""
        self.detach()
        self._end_now(Status.SKIPPED, "the stream was abandoned")

    def succeed(self, args: tuple, kwargs: dict, result: Any, instance: Any = None) -> None:
        """The app returned ``result`` (for streams: after the stream ended). Never raises."""
        self.detach()
        if self._ended:
            return
        tracer, options, span = self.tracer, self.options, self.span
        end_time = time.time_ns()
        content: Optional[dict] = None  # content attributes not yet set on the span
        try:
            settings = tracer.settings
            call = CallInfo(args, kwargs, options.extractor.arguments(args, kwargs, bound=options.bound or instance is not None), result, instance)
            if self.chunks is not None:
                call.result = "".join(self.chunks)
            question = answer = None
            contexts: Optional[list[str]] = None
            extraction_error: Optional[str] = None
            try:
                question = options.extractor.question(call)
                answer = options.extractor.answer(call) if self.chunks is None else call.result
                contexts = options.extractor.contexts(call)
            except ExtractionError as exc:
                extraction_error = str(exc)
            try:
                question, answer, contexts = tracer.apply_redaction(question, answer, contexts)
            except Exception as exc:
                # never record or send unredacted text
                self._end_now(Status.ERROR, f"redaction hook raised {type(exc).__name__}: {exc}", end_time=end_time, error_type="redaction")
                return
            # The content attributes are set together with the outcome's attributes (one
            # set_attributes call, in the same order: content first); samplers never see the span.
            content = content_attributes(question, answer, contexts, settings.max_content_chars) if settings.capture_content and span.is_recording() else None
            if extraction_error is not None:
                if content:
                    span.set_attributes(content)
                content = None
                span.set_attribute(A.EXTRACTION_ERROR, extraction_error)
                self._end_now(Status.ERROR, extraction_error, end_time=end_time, error_type="extraction")
                return
            trace_id = span.get_span_context().trace_id
            sampler = tracer.sampler
            try:
                if type(sampler) in TRACE_ID_SAMPLERS:  # decides on the trace id alone
                    sampled = sampler.sample_trace_id(trace_id)
                else:
                    sampled = sampler.should_sample(SamplingContext(trace_id, options.name, question, answer, contexts, call.arguments))
            except Exception as exc:
                self._end_now(Status.ERROR, f"sampler raised {type(exc).__name__}: {exc}", end_time=end_time, error_type="sampler", attributes=content)
                return
            if not sampled:
                self._end_now(Status.NOT_SAMPLED, end_time=end_time, attributes=content)
                return
            if content:
                span.set_attributes(content)
            content = None
            job = EvaluationJob(self, question, answer, contexts, end_time)  # type: ignore[arg-type]
            if settings.attach == "answer_span":
                self._ended = True  # the job owns the span from here: it ends it exactly once
                tracer.worker.submit(job)
            else:
                tracer.worker.submit(job)  # a refused job marks this span dropped before it ends
                self._end_span(end_time)
        except Exception as exc:
            logger.exception("relevancy-tracer: handling a traced call failed")
            self._end_now(Status.ERROR, f"internal error: {type(exc).__name__}: {exc}", end_time=end_time, error_type="internal", attributes=content or None)

    def _end_span(self, end_time: Optional[int] = None) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self.span.end(end_time=end_time)
        except Exception:
            logger.exception("relevancy-tracer: ending a span failed")

    def _end_now(
        self,
        status: str,
        error: Optional[str] = None,
        *,
        end_time: Optional[int] = None,
        error_type: Optional[str] = None,
        attributes: Optional[dict] = None,
    ) -> None:
        """End the span at once with ``status`` (``attributes`` first, in one call) and count it."""
        if self._ended:
            return
        try:
            attrs = attributes if attributes is not None else {}
            attrs[A.STATUS] = status
            if error:
                attrs[A.ERROR] = error
            if error_type:
                attrs[A.ERROR_TYPE] = error_type
            self.span.set_attributes(attrs)
        except Exception:
            pass
        self._end_span(end_time)
        self.tracer.metrics.count(self.options.name, status, error_type=error_type)


class EvaluationJob:
    """One sampled call's evaluation, run by the worker; finishes its span exactly once."""

    __slots__ = ("state", "tracer", "question", "answer", "contexts", "end_time", "deadline", "timeout", "span_context", "_lock", "_done")

    def __init__(self, state: CallState, question: str, answer: str, contexts: Optional[list[str]], end_time: int):
        self.state = state
        self.tracer = state.tracer
        self.question, self.answer, self.contexts = question, answer, contexts
        self.end_time = end_time
        settings = self.tracer.settings
        self.deadline = time.monotonic() + settings.hold_timeout
        self.timeout = settings.evaluation_timeout
        self.span_context = state.span.get_span_context()
        self._lock = threading.Lock()
        self._done = False

    async def run(self) -> None:
        with suppressed_instrumentation():
            result = await self.tracer.engine.ascore(self.question, self.answer, self.contexts, **self.state.options.overrides)
        if result.ok:
            self._complete(Status.SCORED, result=result)
        else:
            self._complete(Status.ERROR, result=result, error=result.error, error_type=result.status)

    def finish(self, status: str, error: Optional[str] = None, reason: Optional[str] = None) -> None:
        """Outcomes decided by the worker: dropped, timeout, shutdown, error."""
        self._complete(status, error=error, reason=reason, error_type="internal" if status == Status.ERROR else None)

    def _complete(self, status: str, *, result: Optional[RelevancyResult] = None, error: Optional[str] = None, reason: Optional[str] = None, error_type: Optional[str] = None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        tracer, state = self.tracer, self.state
        settings = tracer.settings
        name = state.options.name
        try:
            attrs: dict[str, Any] = {}
            if result is not None:
                attrs = result_attributes(result, capture_content=settings.capture_content, limit=settings.max_content_chars)
            attrs[A.STATUS] = status
            if error:
                attrs[A.ERROR] = error
            if reason:
                attrs[A.DROP_REASON] = reason
            if settings.attach == "answer_span" or (status == Status.DROPPED and state.span.is_recording()):
                span = state.span
                span.set_attributes(attrs)
                if result is not None:
                    span.add_event(A.GEN_AI_EVALUATION_RESULT, evaluation_event(result), timestamp=self.end_time)
                if settings.attach == "answer_span":
                    span.end(end_time=self.end_time)
            else:
                self._emit_evaluation_span(attrs, result, status)
        except Exception:
            logger.exception("relevancy-tracer: writing a result failed")
            if settings.attach == "answer_span":
                try:
                    state.span.end(end_time=self.end_time)
                except Exception:
                    pass
        try:
            label = result.label if (result is not None and result.ok) else None
            tracer.metrics.count(name, status, label=label, reason=reason, error_type=error_type)
            if result is not None:
                tracer.metrics.record_result(name, result.score if result.ok else None, result.latency_ms / 1000.0, result.method, result.evaluator_version)
                if result.ok and tracer.drift is not None:
                    tracer.drift.observe(name, float(result.score))  # type: ignore[arg-type]
        except Exception:
            logger.exception("relevancy-tracer: recording metrics failed")
        hook = settings.on_result
        if hook is not None:
            try:
                content = settings.capture_content
                hook(
                    EvaluationOutcome(
                        name,
                        status,
                        result,
                        format(self.span_context.trace_id, "032x"),
                        format(self.span_context.span_id, "016x"),
                        self.question if content else None,
                        self.answer if content else None,
                    )
                )
            except Exception:
                logger.exception("relevancy-tracer: the on_result hook raised")

    def _emit_evaluation_span(self, attrs: dict, result: Optional[RelevancyResult], status: str) -> None:
        parent = trace.set_span_in_context(NonRecordingSpan(self.span_context))
        now = time.time_ns()
        start = now - int((result.latency_ms if result is not None else 0.0) * 1e6)
        attrs = {A.OPENINFERENCE_SPAN_KIND: A.SPAN_KIND_EVALUATOR, **attrs}
        if self.tracer.settings.capture_content:
            attrs.update(content_attributes(self.question, self.answer, None, self.tracer.settings.max_content_chars))
        span = self.tracer.otel_tracer.start_span(
            A.EVALUATION_NAME,
            context=parent,
            kind=SpanKind.INTERNAL,
            links=[Link(self.span_context, {"relevancy.link": "evaluated_span"})],
            start_time=start,
            attributes=attrs,
        )
        if result is not None:
            span.add_event(A.GEN_AI_EVALUATION_RESULT, evaluation_event(result), timestamp=now)
        if status == Status.SCORED:
            span.set_status(SpanStatus(StatusCode.OK))
        else:
            span.set_status(SpanStatus(StatusCode.ERROR, (attrs.get(A.ERROR) or status)[:200]))
        span.end(end_time=now)


# ---------------------------------------------------------------------------------- process-wide

_lock = threading.RLock()
_current: Optional[Tracer] = None
_atexit_registered = False


def _current_depth() -> int:
    tracer = _current
    return tracer.worker.depth if tracer is not None else 0


def current() -> Tracer:
    """The process's tracer, built from the environment on first use (no provider setup)."""
    tracer = _current
    if tracer is None:
        with _lock:
            if _current is None:
                _install(Tracer(runtime.get_settings(), engine=runtime.get_engine()))
            tracer = _current
    return tracer  # type: ignore[return-value]


def _install(tracer: Tracer) -> None:
    global _current, _atexit_registered
    _current = tracer
    if not _atexit_registered:
        _register_exit_hook()
        _atexit_registered = True


def _register_exit_hook() -> None:
    """Run :func:`shutdown` at interpreter exit, early enough to still finish evaluations.

    ``concurrent.futures`` refuses new work once interpreter shutdown starts, before ordinary
    ``atexit`` handlers run, so pending evaluations (which use worker threads) would fail.
    ``threading._register_atexit`` hooks run before that, and before the OpenTelemetry SDK
    providers' own ``atexit`` shutdown, which then exports the spans ended here.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_shutdown_at_exit)
            return
        except Exception:  # RuntimeError once shutdown has begun
            pass
    atexit.register(_shutdown_at_exit)


def configure(**settings: Any) -> Settings:
    """Configure the engine and the tracer; returns the resolved settings.

    Every setting is an argument here or a ``RELEVANCY_TRACER_<NAME>`` environment variable
    (see the README's table). With ``setup_otel`` (default true) and no TracerProvider /
    MeterProvider set by the app, SDK providers with OTLP exporters are installed from the
    standard ``OTEL_*`` variables. Calling it again replaces the tracer: pending evaluations of
    the old one get up to 5 s to finish.

    Raises TypeError / ValueError for an unknown setting or a bad value.
    """
    resolved = Settings.resolve(**settings)
    with _lock:
        previous = _current
        owned = install_providers() if resolved.setup_otel else OwnedProviders()
        if previous is not None:
            # keep providers installed earlier owned by the new tracer
            owned.tracer_provider = owned.tracer_provider or previous.owned.tracer_provider
            owned.meter_provider = owned.meter_provider or previous.owned.meter_provider
            previous.owned = OwnedProviders()
        runtime.set_settings(resolved)
        _install(Tracer(resolved, engine=runtime.get_engine(), owned=owned))
    if previous is not None:
        previous.worker.shutdown(5.0)
    return resolved


def flush(timeout: float = 30.0) -> bool:
    """Wait up to ``timeout`` seconds for every pending evaluation to finish and its span to be
    handed to the span processor, then force-flush the providers. True when all of it finished."""
    tracer = _current
    return True if tracer is None else tracer.flush(timeout)


def shutdown(timeout: float = 30.0) -> bool:
    """Flush, then cancel what is left (ending every held span with status ``shutdown``), and shut
    down providers this library installed. Also runs at interpreter exit."""
    global _current
    with _lock:
        tracer = _current
        _current = None
    return True if tracer is None else tracer.shutdown(timeout)


def _shutdown_at_exit() -> None:
    try:
        shutdown(timeout=min(10.0, (_current.settings.hold_timeout if _current else 10.0)))
    except Exception:  # pragma: no cover - never fail interpreter exit
        pass
