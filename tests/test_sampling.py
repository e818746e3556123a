"""Samplers: trace-id ratio (OTel's rule), token-bucket rate limit, callables, composition."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from relevancy_tracer.tracing.sampling import AllOf, AlwaysOff, AlwaysOn, CallableSampler, RateLimitSampler, SamplingContext, TraceIdRatioSampler, build_sampler


def ctx(trace_id=0, **kw):
    return SamplingContext(trace_id=trace_id, span_name="answer", **kw)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_ratio_matches_opentelemetry_trace_id_ratio_based(ratio):
    ours = TraceIdRatioSampler(ratio)
    theirs = TraceIdRatioBased(ratio)
    rng = random.Random(7)
    for _ in range(2000):
        trace_id = rng.getrandbits(128)
        expected = theirs.should_sample(None, trace_id, "x").decision.is_sampled()
        assert ours.should_sample(ctx(trace_id)) == expected


RATIOS = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
TRACE_IDS = st.integers(min_value=1, max_value=(1 << 128) - 1)


@settings(max_examples=500, deadline=None)
@given(ratio=RATIOS, trace_id=TRACE_IDS)
def test_the_ratio_decides_as_the_sdk_for_any_trace_id_and_ratio(ratio, trace_id):
    """Same decision as the OTel SDK's TraceIdRatioBased, by the SDK's own bound."""
    ours = TraceIdRatioSampler(ratio)
    assert ours.bound == TraceIdRatioBased.get_bound_for_rate(ratio)
    expected = TraceIdRatioBased(ratio).should_sample(None, trace_id, "x").decision.is_sampled()
    assert ours.should_sample(ctx(trace_id)) == ours.sample_trace_id(trace_id) == expected


@settings(max_examples=300, deadline=None)
@given(ratio=RATIOS, high=st.integers(min_value=0, max_value=(1 << 64) - 1), delta=st.integers(-2, 2))
def test_the_ratio_decides_as_the_sdk_at_its_bound(ratio, high, delta):
    """Trace ids whose lower 64 bits lie next to the bound: where an off-by-one would show."""
    low = min(max(TraceIdRatioBased.get_bound_for_rate(ratio) + delta, 0), (1 << 64) - 1)
    trace_id = (high << 64) | low
    if trace_id == 0:
        return  # no trace id: a random draw, not the trace-id rule
    expected = TraceIdRatioBased(ratio).should_sample(None, trace_id, "x").decision.is_sampled()
    assert TraceIdRatioSampler(ratio).sample_trace_id(trace_id) == expected


def test_ratio_without_trace_id_is_random_with_the_same_probability():
    sampler = TraceIdRatioSampler(0.3)
    share = sum(sampler.should_sample(ctx(0)) for _ in range(20000)) / 20000
    assert 0.27 < share < 0.33


def test_rate_limit_token_bucket():
    now = [0.0]
    sampler = RateLimitSampler(per_minute=60, burst=2, clock=lambda: now[0])
    assert [sampler.should_sample(ctx()) for _ in range(3)] == [True, True, False]
    now[0] += 1.0  # one token per second
    assert [sampler.should_sample(ctx()) for _ in range(2)] == [True, False]
    now[0] += 100.0  # refills only up to the burst
    assert [sampler.should_sample(ctx()) for _ in range(3)] == [True, True, False]
    assert RateLimitSampler(per_minute=600).burst == 100.0 and RateLimitSampler(per_minute=6).burst == 1.0


def test_all_of_short_circuits_so_the_rate_limit_only_spends_accepted_calls():
    now = [0.0]
    limit = RateLimitSampler(per_minute=60, burst=1, clock=lambda: now[0])
    composed = AllOf(CallableSampler(lambda c: c.question == "keep"), limit)
    assert composed.should_sample(ctx(question="drop")) is False
    assert composed.should_sample(ctx(question="keep")) is True  # the token was not spent above
    assert "RateLimitSampler" in composed.get_description()


def test_build_sampler_from_settings():
    assert isinstance(build_sampler(), AlwaysOn)
    assert isinstance(build_sampler(ratio=0.5), TraceIdRatioSampler)
    composed = build_sampler(ratio=0.5, rate_limit=10, fn=lambda c: True)
    assert [type(s).__name__ for s in composed.samplers] == ["TraceIdRatioSampler", "CallableSampler", "RateLimitSampler"]
    assert AlwaysOff().should_sample(ctx()) is False
    with pytest.raises(ValueError):
        TraceIdRatioSampler(1.5)
