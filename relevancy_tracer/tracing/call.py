"""The per-call path: a traced call's span, its sampling decision, extraction and hand-off.

The decorator (:mod:`.decorator`) calls :meth:`CallState.begin` before the app's function and one
of the outcome methods after it. What happens on the caller's thread, in order:

1. **Span.** An INTERNAL span named after the function is started and made current, so the app's
   own spans nest under it.
2. **Outcome.** The app raised: the exception is recorded (type only without content capture)
   and re-raised unchanged by the decorator; ``CancelledError``/``GeneratorExit`` are not errors
   (status ``cancelled``). A stream closed before its end: status ``incomplete``, not scored
   unless ``score_incomplete_streams``. A sync function returned an awaitable or an iterator the
   tracer must not consume: status ``skipped``.
3. **Recording.** A span nobody records (``OTEL_SDK_DISABLED``, a no-op provider, a parent
   sampled out) is not evaluated unless ``score_unrecorded`` is set (metrics-only scoring):
   with 1% trace sampling, 99% of the judge spend would be wasted otherwise.
4. **Sampling.** The samplers decide on the trace id first (ratio, rate limit, user callable):
   an unsampled call costs only its span (kind and ``relevancy.status=not_sampled``); nothing is
   extracted, redacted or recorded for it.
5. **Extraction and redaction** (sampled calls only), then the content attributes (capture on),
   with texts made encodable and capped (count of contexts and characters), and a job holding
   the truncated texts goes to the job queue, which never blocks.

Every span ends exactly once: ending goes through one guarded method, and in ``answer_span`` mode
the job owns the span from the moment it is submitted (a refused job ends it at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from .._logging import log_failure
from .extraction import CallInfo, ExtractionError, Extractor, cap_contexts
from ..otel import attributes as A
from ..otel.results import outcome_attributes, plain_outcome, record_outcome
from ..otel.spans import content_attributes, record_exception
from ..result import Status
from .job import EvaluationJob
from .sampling import TRACE_ID_SAMPLERS, SamplingContext

if TYPE_CHECKING:  # pragma: no cover
    from .runtime import Runtime

logger = logging.getLogger("relevancy_tracer")

#: Exceptions that end a call without it failing: task cancellation and a generator's close().
NOT_ERRORS = (asyncio.CancelledError, GeneratorExit)


#: The attributes every traced call's span starts with (the SDK copies them; never mutated).
_START_ATTRIBUTES = {A.OPENINFERENCE_SPAN_KIND: A.SPAN_KIND_CHAIN}


class TraceOptions:
    """Per-decoration options: span name, extraction rules, evaluation overrides.

    Attributes:
        name: span name. extractor: the :class:`~relevancy_tracer.tracing.extraction.Extractor`.
        overrides: per-function evaluation settings. bound: the decorated callable is a bound
        method (args exclude self). stream: wrap (async) generators *returned* by a sync or
        async function, scoring the joined chunks (opt-in: the iterator is replaced by a
        delegating one).
    """

    __slots__ = ("name", "extractor", "overrides", "bound", "stream")

    def __init__(self, name: str, extractor: Extractor, overrides: dict, bound: bool, stream: bool = False):
        self.name = name
        self.extractor = extractor
        self.overrides = overrides
        self.bound = bound
        self.stream = stream


class CallState:
    """One traced call in flight: its span, context token and end-of-call handling."""

    __slots__ = ("runtime", "options", "span", "token", "chunks", "chunk_chars", "truncated", "_ended")

    def __init__(self, runtime: "Runtime", options: TraceOptions, span: Any, token: Any):
        self.runtime = runtime
        self.options = options
        self.span = span
        self.token = token
        self.chunks: Optional[list[str]] = None
        self.chunk_chars = 0
        self.truncated = False
        self._ended = False

    @classmethod
    def begin(cls, runtime: "Runtime", options: TraceOptions) -> Optional["CallState"]:
        """Start the call's span and make it current. None when this failed (the call then
        runs untraced)."""
        try:
            span = runtime.otel_tracer.start_span(options.name, kind=SpanKind.INTERNAL, attributes=_START_ATTRIBUTES)
            token = otel_context.attach(trace.set_span_in_context(span))
            return cls(runtime, options, span, token)
        except Exception:
            log_failure("could not start a span", runtime.settings.capture_content)
            return None

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
            budget = self.runtime.settings.max_answer_chars + 1 - self.chunk_chars
            if budget <= 0:
                self.truncated = self.truncated or bool(text)
                return
            piece = text[:budget]
            self.truncated = self.truncated or len(piece) < len(text)
            self.chunks.append(piece)
            self.chunk_chars += len(piece)
        except Exception:
            pass

    # -- outcomes that end the span at once
    def fail(self, exc: BaseException) -> None:
        """The app raised ``exc``. Cancellation and a generator's close are not failures."""
        self.detach()
        if self._ended:
            return
        if isinstance(exc, NOT_ERRORS):
            self._end_now(Status.CANCELLED, reason=type(exc).__name__)
            return
        settings = self.runtime.settings
        try:
            record_exception(self.span, exc, capture_content=settings.capture_content, limit=settings.max_content_chars)
        except Exception:
            logger.debug("relevancy-tracer: recording an exception failed", exc_info=True)
        self._end_now(Status.SKIPPED, reason="exception")

    def skip(self, reason: str) -> None:
        """Nothing to score (e.g. a sync function returned an awaitable): end the span."""
        self.detach()
        self._end_now(Status.SKIPPED, reason=reason)

    def abandon(self) -> None:
        """A stream that was never consumed to the end nor closed (collected): end the span."""
        self.detach()
        self._end_now(Status.SKIPPED, reason="abandoned_stream")

    def incomplete(self, args: tuple, kwargs: dict, instance: Any = None) -> None:
        """The consumer closed the stream before its end (a client disconnect): status
        ``incomplete``; scored only with ``score_incomplete_streams``."""
        self.detach()
        if self.runtime.settings.score_incomplete_streams:
            self.succeed(args, kwargs, None, instance)
        else:
            self._end_now(Status.INCOMPLETE, reason="stream_closed_early")

    # -- the normal outcome
    def succeed(self, args: tuple, kwargs: dict, result: Any, instance: Any = None) -> None:
        """The app returned ``result`` (for streams: after the stream ended). Never raises."""
        self.detach()
        if self._ended:
            return
        runtime, options, span = self.runtime, self.options, self.span
        settings = runtime.settings
        end_time = time.time_ns()
        try:
            recording = span.is_recording()
            if not recording and not settings.score_unrecorded:
                self._end_now(Status.NOT_SAMPLED, reason="trace_not_recorded", end_time=end_time)
                return
            trace_id = span.get_span_context().trace_id
            sampler = runtime.sampler
            by_trace_id = type(sampler) in TRACE_ID_SAMPLERS  # decides on the trace id alone
            if by_trace_id and not sampler.sample_trace_id(trace_id):  # type: ignore[attr-defined]
                self._end_not_sampled(end_time)  # the common path: nothing is bound or built
                return
            call = CallInfo(args, kwargs, options.extractor.arguments(args, kwargs, bound=options.bound or instance is not None), result, instance)
            if self.chunks is not None:
                call.result = "".join(self.chunks)
            if not by_trace_id:
                try:
                    sampled = sampler.should_sample(SamplingContext(trace_id, options.name, arguments=call.arguments, extract=lambda: self._extract(call)))
                except Exception as exc:
                    self._end_now(Status.ERROR, f"sampler raised {type(exc).__name__}", end_time=end_time, error_type="sampler")
                    return
                if not sampled:
                    self._end_now(Status.NOT_SAMPLED, end_time=end_time)
                    return
            try:
                question, answer, contexts = self._extract(call)
            except ExtractionError as exc:
                attrs = {A.EXTRACTION_ERROR: str(exc)} if settings.capture_content else {}
                self._end_now(Status.ERROR, str(exc), end_time=end_time, error_type="extraction", attributes=attrs)
                return
            past = options.extractor.history(call, question, settings.max_history_turns, settings.max_history_chars) if isinstance(question, str) else None
            try:
                question, answer, contexts = runtime.redact(question, answer, contexts)
                past = runtime.redact_history(past)
            except Exception as exc:  # never record or send unredacted text; the message may quote it
                self._end_now(Status.ERROR, f"redaction hook raised {type(exc).__name__}", end_time=end_time, error_type="redaction")
                return
            if settings.capture_content and recording:
                span.set_attributes(content_attributes(question, answer, contexts, settings.max_content_chars))
            job = EvaluationJob(runtime, span, options.name, options.overrides, question, answer, contexts, end_time, history=past)
            if settings.attach == "answer_span":
                self._ended = True  # the job owns the span from here: it ends it exactly once
                try:
                    runtime.jobs.submit(job)  # a refused job is finished (and its span ended) at once
                except Exception:
                    log_failure("submitting an evaluation failed", settings.capture_content)
                    job.finish(Status.ERROR, "internal error", "submit")
            else:
                try:
                    runtime.jobs.submit(job)  # a refused job marks this span dropped before it ends
                finally:
                    self._end_span(end_time)
        except Exception as exc:
            log_failure("handling a traced call failed", settings.capture_content)
            self._end_now(Status.ERROR, f"internal error: {type(exc).__name__}", end_time=end_time, error_type="internal")

    def _extract(self, call: CallInfo) -> tuple[str, str, Optional[list[str]]]:
        """(question, answer, contexts) of the call, contexts capped; raises ExtractionError."""
        extractor, settings = self.options.extractor, self.runtime.settings
        question = extractor.question(call)
        answer = call.result if self.chunks is not None else extractor.answer(call)
        contexts = cap_contexts(extractor.contexts(call), settings.max_contexts, settings.max_context_chars)
        return question, answer, contexts

    # -- ending
    def _end_span(self, end_time: Optional[int] = None) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self.span.end(end_time=end_time)
        except Exception:
            log_failure("ending a span failed", self.runtime.settings.capture_content)

    def _end_not_sampled(self, end_time: int) -> None:
        """:meth:`_end_now` for ``not_sampled`` without a reason, the unsampled call's path: the
        same attributes and count, from :func:`~relevancy_tracer.otel.results.plain_outcome`."""
        attrs = plain_outcome(Status.NOT_SAMPLED)
        try:
            self.span.set_attributes(attrs)
        except Exception:
            pass
        self._end_span(end_time)
        try:
            self.runtime.metrics.count(self.options.name, Status.NOT_SAMPLED)
        except Exception:
            pass

    def _end_now(
        self,
        status: str,
        error: Optional[str] = None,
        *,
        end_time: Optional[int] = None,
        error_type: Optional[str] = None,
        reason: Optional[str] = None,
        attributes: Optional[dict] = None,
    ) -> None:
        """End the span at once with ``status`` (and the error's type; its message only with
        content capture) and count it."""
        if self._ended:
            return
        settings = self.runtime.settings
        attrs = {A.STATUS: status}
        try:
            attrs = outcome_attributes(status, capture_content=settings.capture_content, limit=settings.max_content_chars, error=error, error_type=error_type, reason=reason)
            self.span.set_attributes({**attributes, **attrs} if attributes else attrs)
        except Exception:
            pass
        self._end_span(end_time)
        try:
            record_outcome(self.runtime.metrics, self.options.name, attrs, None)
        except Exception:
            pass
