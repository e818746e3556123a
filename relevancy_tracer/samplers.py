"""Samplers: which traced calls are scored (public API).

``configure(sample_ratio=..., rate_limit=...)`` builds the usual ones from the settings; these
classes are for building a ``sampler=fn`` of your own (``fn(SamplingContext) -> bool``, composed
by ``configure`` after the ratio and before the rate limit). A tenth of the traces of one busy
function, every call of the others::

    from relevancy_tracer.samplers import TraceIdRatioSampler

    tenth = TraceIdRatioSampler(0.1)
    relevancy_tracer.configure(
        sampler=lambda context: context.span_name != "search.answer" or tenth.should_sample(context)
    )

* :class:`SamplingContext`: what a sampler may look at (trace id, span name, the call's
  arguments, and the question, answer and contexts, extracted only when read).
* :class:`AlwaysOn`, :class:`AlwaysOff`: every call, no call.
* :class:`TraceIdRatioSampler`: a ratio of traces, decided on the trace id as the OpenTelemetry
  SDK's ``TraceIdRatioBased`` decides (every service of a trace decides alike).
* :class:`RateLimitSampler`: at most N evaluations per minute (a token bucket): the cost cap.
* :class:`CallableSampler`: ``fn(SamplingContext) -> bool``.
* :class:`AllOf`: a call is scored when every sampler agrees (in order, stopping at the first no).
* :class:`Sampler`: the protocol: ``should_sample(context) -> bool`` and ``get_description()``.

A sampler must be cheap and thread-safe; an exception from one is caught by the tracer, counted
(status ``error``, error type ``sampler``) and the call is not scored. Independent of
OpenTelemetry's trace sampling (see docs/tracing.md, Sampling).
"""

from __future__ import annotations

from .tracing.sampling import (
    AllOf,
    AlwaysOff,
    AlwaysOn,
    CallableSampler,
    RateLimitSampler,
    Sampler,
    SamplingContext,
    TraceIdRatioSampler,
)

__all__ = [
    "AllOf",
    "AlwaysOff",
    "AlwaysOn",
    "CallableSampler",
    "RateLimitSampler",
    "Sampler",
    "SamplingContext",
    "TraceIdRatioSampler",
]
