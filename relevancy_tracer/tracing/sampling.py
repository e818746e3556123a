"""Samplers: which traced calls are scored. Independent of OpenTelemetry's trace sampling.

Small composable samplers, after the OpenTelemetry SDK's ``sampling`` module:

* :class:`TraceIdRatioSampler` decides on the trace id, with the bound of OTel's
  ``TraceIdRatioBased`` (lower 64 bits below ``get_bound_for_rate(ratio)``), so every service of a trace
  decides alike, and with a ratio at or below the trace sampling ratio every scored call lies in
  an exported trace.
* :class:`RateLimitSampler` is the cost cap: a token bucket of evaluations per minute.
* :class:`CallableSampler` wraps a user function ``fn(SamplingContext) -> bool``.
* :class:`AllOf` composes them: a call is scored only when every sampler agrees; samplers run
  in order and stop at the first no, so put the rate limit last (it only spends a token on calls
  the others accepted). :func:`build_sampler` does that from the settings.

A sampler must be cheap and thread-safe; an exception from one is caught by the tracer,
counted (status ``error``, error type ``sampler``) and the call is not scored.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from .._background import fork as _fork

_UNSET: Any = object()


class SamplingContext:
    """What a sampler may look at.

    Samplers run before extraction and redaction (an unsampled call costs only its span), so the
    texts are extracted only when a sampler reads them: ``question``, ``answer`` and
    ``contexts`` are computed on first access (None when extraction fails) and never recorded.

    Attributes:
        trace_id: the call's 128-bit trace id (0 when there is no valid span context).
        span_name: name of the call's span.
        question, answer: the extracted texts (None when extraction failed), lazily.
        contexts: extracted contexts or None, lazily.
        arguments: the call's arguments by parameter name.
    """

    __slots__ = ("trace_id", "span_name", "arguments", "_question", "_answer", "_contexts", "_extract")

    def __init__(
        self,
        trace_id: int,
        span_name: str,
        question: Optional[str] = _UNSET,
        answer: Optional[str] = _UNSET,
        contexts: Optional[Sequence[str]] = _UNSET,
        arguments: Optional[dict] = None,
        extract: Optional[Callable[[], tuple]] = None,
    ):
        self.trace_id = trace_id
        self.span_name = span_name
        self.arguments = arguments
        self._extract = extract
        self._question = None if question is _UNSET and extract is None else question
        self._answer = None if answer is _UNSET and extract is None else answer
        self._contexts = None if contexts is _UNSET and extract is None else contexts

    def _texts(self) -> None:
        extract, self._extract = self._extract, None
        question = answer = contexts = None
        if extract is not None:
            try:
                question, answer, contexts = extract()
            except Exception:
                pass
        if self._question is _UNSET:
            self._question = question
        if self._answer is _UNSET:
            self._answer = answer
        if self._contexts is _UNSET:
            self._contexts = contexts

    @property
    def question(self) -> Optional[str]:
        if self._question is _UNSET:
            self._texts()
        return self._question

    @property
    def answer(self) -> Optional[str]:
        if self._answer is _UNSET:
            self._texts()
        return self._answer

    @property
    def contexts(self) -> Optional[Sequence[str]]:
        if self._contexts is _UNSET:
            self._texts()
        return self._contexts

    def __repr__(self) -> str:
        return f"SamplingContext(trace_id={self.trace_id:032x}, span_name={self.span_name!r})"


class Sampler(Protocol):
    def should_sample(self, context: SamplingContext) -> bool:
        """True when this call should be scored."""
        ...

    def get_description(self) -> str:
        """A short description, as OTel samplers have."""
        ...


class AlwaysOn:
    """Scores every call."""

    def should_sample(self, context: SamplingContext) -> bool:
        return True

    def sample_trace_id(self, trace_id: int) -> bool:
        """The decision from the trace id alone (see :data:`TRACE_ID_SAMPLERS`)."""
        return True

    def get_description(self) -> str:
        return "AlwaysOn"


class AlwaysOff:
    """Scores no call."""

    def should_sample(self, context: SamplingContext) -> bool:
        return False

    def sample_trace_id(self, trace_id: int) -> bool:
        """The decision from the trace id alone (see :data:`TRACE_ID_SAMPLERS`)."""
        return False

    def get_description(self) -> str:
        return "AlwaysOff"


class TraceIdRatioSampler:
    """Scores a ``ratio`` (0..1) of traces, decided on the trace id.

    The decision of the OpenTelemetry SDK's ``TraceIdRatioBased`` for the same trace id and
    ratio: sampled when the lower 64 bits of the trace id are below the SDK's
    ``TraceIdRatioBased.get_bound_for_rate(ratio)`` (``self.bound``). Calls without a valid
    trace id (tracing off) fall back to a random draw with the same probability.

    Args:
        ratio: the share of traces scored, 0 to 1.

    Raises:
        ValueError: ``ratio`` outside [0, 1].
    """

    def __init__(self, ratio: float):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        self.bound = TraceIdRatioBased.get_bound_for_rate(ratio)

    def should_sample(self, context: SamplingContext) -> bool:
        return self.sample_trace_id(context.trace_id)

    def sample_trace_id(self, trace_id: int) -> bool:
        """The decision from the trace id alone (see :data:`TRACE_ID_SAMPLERS`)."""
        if trace_id:
            return (trace_id & TraceIdRatioBased.TRACE_ID_LIMIT) < self.bound
        return random.random() < self.ratio

    def get_description(self) -> str:
        return f"TraceIdRatioSampler{{{self.ratio}}}"


class RateLimitSampler:
    """At most ``per_minute`` evaluations per minute on average: a token bucket.

    The bucket holds ``burst`` tokens (default: 10 seconds' worth, at least 1) and refills
    continuously at ``per_minute / 60`` tokens per second. A call takes one token or is not
    scored. ``clock`` (seconds, monotonic) is injectable for tests.
    """

    def __init__(self, per_minute: float, burst: Optional[float] = None, clock: Callable[[], float] = time.monotonic):
        if per_minute <= 0:
            raise ValueError(f"per_minute must be > 0, got {per_minute}")
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.burst = float(burst) if burst is not None else max(1.0, self.rate * 10.0)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()
        _fork.renew_after_fork(self, _renew_lock)

    def should_sample(self, context: SamplingContext) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def get_description(self) -> str:
        return f"RateLimitSampler{{{self.per_minute}/min, burst {self.burst:g}}}"


def _renew_lock(obj: Any) -> None:
    obj._lock = threading.Lock()


class CallableSampler:
    """Wraps ``fn(SamplingContext) -> bool``; its exceptions propagate to the tracer."""

    def __init__(self, fn: Callable[[SamplingContext], Any]):
        self.fn = fn

    def should_sample(self, context: SamplingContext) -> bool:
        return bool(self.fn(context))

    def get_description(self) -> str:
        return f"CallableSampler{{{getattr(self.fn, '__qualname__', repr(self.fn))}}}"


class AllOf:
    """Scores a call only when every sampler agrees (evaluated in order, stops at the first no)."""

    def __init__(self, *samplers: Sampler):
        self.samplers = samplers

    def should_sample(self, context: SamplingContext) -> bool:
        for sampler in self.samplers:
            if not sampler.should_sample(context):
                return False
        return True

    def get_description(self) -> str:
        return "AllOf{" + ",".join(s.get_description() for s in self.samplers) + "}"


#: Samplers whose decision depends on the trace id only: for exactly these types (not
#: subclasses, which may override ``should_sample``) the tracer calls ``sample_trace_id`` and
#: skips building a :class:`SamplingContext` on every call. The decision is the same.
TRACE_ID_SAMPLERS = (AlwaysOn, AlwaysOff, TraceIdRatioSampler)


def build_sampler(ratio: float = 1.0, rate_limit: Optional[float] = None, fn: Optional[Callable[[SamplingContext], Any]] = None) -> Sampler:
    """The composed sampler of the settings: ratio, then the user callable, then the rate limit."""
    parts: list[Sampler] = []
    if ratio < 1.0:
        parts.append(TraceIdRatioSampler(ratio))
    if fn is not None:
        parts.append(fn if hasattr(fn, "should_sample") else CallableSampler(fn))  # type: ignore[arg-type]
    if rate_limit:
        parts.append(RateLimitSampler(rate_limit))
    if not parts:
        return AlwaysOn()
    return parts[0] if len(parts) == 1 else AllOf(*parts)
