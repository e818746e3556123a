"""Samplers: which traced calls are scored. Independent of OpenTelemetry's trace sampling.

Small composable samplers, after the OpenTelemetry SDK's ``sampling`` module:

* :class:`TraceIdRatioSampler` decides on the trace id, with the rule of OTel's
  ``TraceIdRatioBased`` (lower 64 bits below ``ratio * 2**64``), so every service of a trace
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
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

_TRACE_ID_LIMIT = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingContext:
    """What a sampler may look at.

    Attributes:
        trace_id: the call's 128-bit trace id (0 when there is no valid span context).
        span_name: name of the call's span.
        question, answer: the extracted texts (None when extraction failed).
        contexts: extracted contexts or None.
        arguments: the call's arguments by parameter name.
    """

    trace_id: int
    span_name: str
    question: Optional[str] = None
    answer: Optional[str] = None
    contexts: Optional[Sequence[str]] = None
    arguments: Optional[dict] = None


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

    Same rule as OpenTelemetry's ``TraceIdRatioBased``: sampled when the lower 64 bits of the
    trace id are below ``round(ratio * 2**64)``. Calls without a valid trace id (tracing off)
    fall back to a random draw with the same probability.
    """

    def __init__(self, ratio: float):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        self.bound = round(ratio * (_TRACE_ID_LIMIT + 1))

    def should_sample(self, context: SamplingContext) -> bool:
        return self.sample_trace_id(context.trace_id)

    def sample_trace_id(self, trace_id: int) -> bool:
        """The decision from the trace id alone (see :data:`TRACE_ID_SAMPLERS`)."""
        if trace_id:
            return (trace_id & _TRACE_ID_LIMIT) < self.bound
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
