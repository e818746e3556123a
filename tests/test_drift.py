"""The in-process drift detector: start and end of a drop in mean score, callbacks, logs."""

from __future__ import annotations

import logging
import random

import pytest

from relevancy_tracer.tracing.drift import DriftDetector, DriftMonitor


def scores(mean, n, rng, spread=0.05):
    return [min(1.0, max(0.0, rng.gauss(mean, spread))) for _ in range(n)]


def test_detects_a_drop_and_its_recovery():
    rng = random.Random(1)
    detector = DriftDetector(window=30, baseline=200, min_baseline=60, drop=0.1)
    changes = []
    for i, s in enumerate(scores(0.85, 200, rng) + scores(0.55, 60, rng) + scores(0.85, 80, rng)):
        change = detector.update(s)
        if change:
            changes.append((change, i))
    assert [c for c, _ in changes] == ["started", "ended"]
    started, ended = changes[0][1], changes[1][1]
    assert 200 <= started < 230 and 260 <= ended < 300


def test_no_alarm_on_a_stable_noisy_stream():
    rng = random.Random(2)
    detector = DriftDetector(window=30, baseline=200, min_baseline=60, drop=0.1)
    assert not any(detector.update(s) for s in scores(0.7, 2000, rng, spread=0.15))


def test_small_drop_below_the_threshold_is_ignored():
    rng = random.Random(3)
    detector = DriftDetector(window=30, baseline=200, min_baseline=60, drop=0.1)
    assert not any(detector.update(s) for s in scores(0.85, 200, rng) + scores(0.8, 200, rng))


def test_monitor_calls_back_and_logs_per_span_name(caplog):
    rng = random.Random(4)
    monitor = DriftMonitor("svc", window=20, baseline=100, min_baseline=40, drop=0.1)
    events = []
    monitor.add_callback(events.append)
    monitor.add_callback(lambda e: 1 / 0)  # a raising callback is contained
    with caplog.at_level(logging.INFO, logger="relevancy_tracer.drift"):
        for s in scores(0.9, 100, rng):
            monitor.observe("good", s)
            monitor.observe("bad", s)
        for s in scores(0.4, 40, rng):
            monitor.observe("bad", s)
            monitor.observe("good", 0.9)
    assert [(e.span_name, e.state) for e in events] == [("bad", "started")]
    assert events[0].window_mean < events[0].baseline_mean - 0.1
    assert monitor.active() == {"good": False, "bad": True}
    assert "relevancy drift started on bad" in caplog.text


def test_parameters_are_validated():
    with pytest.raises(ValueError):
        DriftDetector(window=1)
    with pytest.raises(ValueError):
        DriftDetector(baseline=10, min_baseline=20)
