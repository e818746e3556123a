"""In-process relevancy drift detection, for users without Prometheus.

A two-window test with hysteresis, per traced function (span name) and evaluator version (an
evaluator change, e.g. another model or calibration, starts a new baseline instead of reading as
app drift):

* the **window** holds the last ``window`` scores (default 50);
* the **baseline** holds up to ``baseline`` scores (default 500) that came before the window;
  while a drift is active the baseline is frozen, so it never adapts to the degraded regime;
* a drift **starts** when, with at least ``min_baseline`` baseline scores and a full window, the
  window mean is below the baseline mean by more than ``drop`` (default 0.1) *and* by more than
  ``z`` (default 3) standard errors of the window mean (baseline std / sqrt(window));
* it **ends** when the window mean comes back within ``drop / 2`` of the baseline mean.

On each start and end: a log record (WARNING / INFO on logger ``relevancy_tracer.drift``), the
``relevancy.drift.active`` gauge (1 during a drift, per ``span.name``), and the callbacks
registered with :meth:`DriftMonitor.add_callback` receive a :class:`DriftEvent`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from .._background import fork as _fork

logger = logging.getLogger("relevancy_tracer.drift")


@dataclass(frozen=True)
class DriftEvent:
    """A drift starting or ending.

    Attributes:
        span_name: the traced function. state: ``started`` or ``ended``.
        evaluator_version: the evaluator whose scores drifted (None if unknown).
        baseline_mean, window_mean: mean scores of the baseline and of the recent window.
        baseline_size, window_size: scores in each. time: Unix time (s).
    """

    span_name: str
    state: str
    baseline_mean: float
    window_mean: float
    baseline_size: int
    window_size: int
    time: float
    evaluator_version: Optional[str] = None


class DriftDetector:
    """The two-window test for one stream of scores (see the module docstring)."""

    def __init__(self, window: int = 50, baseline: int = 500, min_baseline: int = 100, drop: float = 0.1, z: float = 3.0):
        if window < 2 or baseline < 2 or min_baseline < 2 or min_baseline > baseline:
            raise ValueError("need window >= 2 and 2 <= min_baseline <= baseline")
        self.window_size, self.baseline_size, self.min_baseline = window, baseline, min_baseline
        self.drop, self.z = drop, z
        self.window: deque = deque(maxlen=window)
        self.baseline: deque = deque(maxlen=baseline)
        self.active = False

    @staticmethod
    def _mean_std(values: Iterable[float]) -> tuple[float, float]:
        data = list(values)
        mean = sum(data) / len(data)
        var = sum((v - mean) ** 2 for v in data) / max(1, len(data) - 1)
        return mean, math.sqrt(var)

    def update(self, score: float) -> Optional[str]:
        """Add a score; returns ``"started"`` or ``"ended"`` when the drift state changes."""
        if len(self.window) == self.window.maxlen:
            oldest = self.window[0]
            if not self.active:
                self.baseline.append(oldest)  # frozen while drifting
        self.window.append(float(score))
        if len(self.window) < self.window_size or len(self.baseline) < self.min_baseline:
            return None
        base_mean, base_std = self._mean_std(self.baseline)
        win_mean = sum(self.window) / len(self.window)
        gap = base_mean - win_mean
        if not self.active:
            stderr = base_std / math.sqrt(self.window_size)
            if gap > self.drop and gap > self.z * stderr:
                self.active = True
                return "started"
        elif gap <= self.drop / 2:
            self.active = False
            return "ended"
        return None

    def means(self) -> tuple[float, float]:
        """(baseline mean, window mean); NaN for an empty one."""
        base = sum(self.baseline) / len(self.baseline) if self.baseline else float("nan")
        win = sum(self.window) / len(self.window) if self.window else float("nan")
        return base, win


class DriftMonitor:
    """Per-span-name drift detectors, with logs, a gauge and callbacks (see module doc).

    Args:
        service_name: ``service.name`` attribute of the gauge. Other arguments are passed to
            each :class:`DriftDetector`.
    """

    def __init__(self, service_name: str = "unknown_service", **detector_args: float):
        self.service_name = service_name
        self._args = detector_args
        self._detectors: dict[tuple[str, Optional[str]], DriftDetector] = {}
        self._callbacks: list[Callable[[DriftEvent], None]] = []
        self._lock = threading.Lock()
        _fork.renew_after_fork(self, DriftMonitor._renew_after_fork)
        _register_gauge(self)

    def _renew_after_fork(self) -> None:
        self._lock = threading.Lock()

    def add_callback(self, callback: Callable[[DriftEvent], None]) -> None:
        """Call ``callback(event)`` when a drift starts or ends (exceptions are logged)."""
        self._callbacks.append(callback)

    def observe(self, span_name: str, score: float, evaluator_version: Optional[str] = None) -> Optional[DriftEvent]:
        """Feed one score of ``evaluator_version``; returns the event when the drift state
        changed. Scores of different evaluator versions are never compared."""
        key = (span_name, evaluator_version)
        with self._lock:
            detector = self._detectors.get(key)
            if detector is None:
                detector = self._detectors[key] = DriftDetector(**self._args)  # type: ignore[arg-type]
            change = detector.update(score)
            if change is None:
                return None
            base, win = detector.means()
            event = DriftEvent(span_name, change, base, win, len(detector.baseline), len(detector.window), time.time(), evaluator_version)
        if change == "started":
            logger.warning("relevancy drift started on %s: window mean %.3f vs baseline %.3f", span_name, win, base)
        else:
            logger.info("relevancy drift ended on %s: window mean %.3f vs baseline %.3f", span_name, win, base)
        for callback in list(self._callbacks):
            try:
                callback(event)
            except Exception:
                logger.exception("relevancy-tracer: a drift callback raised")
        return event

    def active(self) -> dict[str, bool]:
        """Drift state per span name (any evaluator version drifting)."""
        out: dict[str, bool] = {}
        with self._lock:
            for (name, _), detector in self._detectors.items():
                out[name] = out.get(name, False) or detector.active
        return out

    def states(self) -> dict[tuple[str, Optional[str]], bool]:
        """Drift state per (span name, evaluator version)."""
        with self._lock:
            return {key: d.active for key, d in self._detectors.items()}


_monitors: list = []
_gauge_lock = threading.Lock()


def _register_gauge(monitor: DriftMonitor) -> None:
    """One ``relevancy.drift.active`` gauge per process, reporting the latest monitor."""
    with _gauge_lock:
        first = not _monitors
        _monitors[:] = [monitor]
    if not first:
        return
    from opentelemetry import metrics

    def observe(_options: object) -> Iterable[metrics.Observation]:
        current = _monitors[0] if _monitors else None
        if current is None:
            return
        for (name, version), active in current.states().items():
            attrs = {"span.name": name, "service.name": current.service_name}
            if version:
                attrs["relevancy.evaluator.version"] = version
            yield metrics.Observation(1 if active else 0, attrs)

    metrics.get_meter("relevancy_tracer").create_observable_gauge(
        "relevancy.drift.active", callbacks=[observe], unit="1", description="1 while relevancy drift is detected on a traced function"
    )
