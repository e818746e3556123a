"""Admission by capacity: score what the scorer can finish in time, shed the rest at once.

An evaluation is worth starting only if its result can arrive while it is still useful: on the
answer span within its ``hold_timeout``, and otherwise, on the linked EVALUATOR span, within
``evaluation_timeout`` of the call. Under overload a plain FIFO queue lets every job wait, so the model
spends its time on evaluations that expire before or while they run, and the scored rate
collapses. :class:`Capacity` measures the scorer as it runs and decides at submission, with
O(1) reads on the caller's thread:

* **Capacity** (evaluations per second) is ``concurrency / D``, where ``D`` is the exponentially
  weighted mean duration of evaluations that started while every slot was busy (until one
  did: of any evaluation). ``D`` is what this process sees, so it includes the time spent
  waiting for a model host shared with other processes: each process measures its own share.
  A process's first evaluation, and every evaluation started before it finished, are not
  measured: they include loading the models (the embedded host's weights, an endpoint's
  connection), often several times a warm evaluation, and a burst arriving right after them
  would be shed for a slowness that is gone. Until a measurement exists there is no depth
  bound (the queue's deadline check still applies).
* **Fair sample.** From the offered rate ``L`` (calls submitted per second, smoothed over about
  :data:`WINDOW` seconds) the effective sample ratio is ``r = min(1, HEADROOM * capacity / L)``,
  applied as a threshold on the trace id with the rule of the ratio sampler (lower 64 bits below
  ``r * sample_ratio * 2**64``: nested in the ``sample_ratio`` sampler's own threshold), so the
  calls scored under overload stay a representative sample, and every
  service of a trace decides alike. Calls above the threshold end at once: status
  ``capacity``, reason ``sample``. The threshold applies only while every slot is busy: a call
  that can start at once waits for nothing, so a burst on a scorer with free slots is scored
  whole (under sustained overload the slots are always busy and the threshold always applies).
* **Expected wait.** A call is admitted only when its expected finish, ``D * max(1, (n + 1) /
  concurrency)`` for ``n`` evaluations queued or running ahead of it
  (:meth:`Capacity.expected_finish`), fits its budget (the answer span's hold): otherwise
  status ``capacity``, reason ``expected_wait``. An idle scorer always takes a call, so a
  scorer slower than the budget still scores (late, on the linked EVALUATOR span) and keeps
  measuring.
* **Admitted work is finished.** The estimate can be wrong (a burst, a model host slowed by
  its other clients): an admitted call still queued when its hold ends is deferred, not shed,
  when it is expected to finish within ``evaluation_timeout`` of the call, and a queued one
  starts whenever it can still finish by then (:meth:`Capacity.worth_starting`).

The estimates are updated on the background loop (every completed evaluation, and once a
second by the job queue's reaper), never on the app's thread. Modelled on sentry-python's
backpressure monitor (a background check lowering the sample rate while the transport is
unhealthy), the OpenTelemetry Collector's memory limiter (refuse early, not late) and
admission control in proxies (reject before doing work that cannot finish).
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable, Optional

_TRACE_ID_LIMIT = (1 << 64) - 1

#: Seconds over which the offered rate is smoothed.
WINDOW = 10.0
#: Shortest time the first offered-rate estimate is taken over (s): the reaper's period.
MIN_SPAN = 1.0
#: Weight of a new duration in the mean (about the last 8 evaluations).
ALPHA = 0.25
#: The admitted rate aimed at, as a multiple of the measured capacity: a little more than it
#: keeps every slot busy; the expected-wait bound sheds the excess.
HEADROOM = 1.1
#: Share of the budget an admitted call is expected to use (room for the estimate's error).
SAFETY = 0.9


class Capacity:
    """The admission controller of one job queue (one model set). See the module docstring.

    Args:
        concurrency: evaluations the queue runs at once (>= 1).
        budget: seconds from submission by which a result should be written (> 0): the answer
            span's ``hold_timeout``, or ``evaluation_timeout`` for evaluation spans.
        base_ratio: the trace-id ratio the calls offered were already sampled at (the
            ``sample_ratio`` setting, in (0, 1]): they all lie under ``base_ratio * 2**64``, so
            the admission's threshold is ``ratio * base_ratio * 2**64``, nested in it
            (consistent sampling: the admitted calls are a fair sample of the offered ones).
        clock: monotonic seconds (injectable for tests).
        warmup: when True (the default), the first evaluation to finish and every one started
            before it finished are not measured (they include loading the models).

    Attributes (read without a lock; written on the background loop):
        ratio: the effective sample ratio in [0, 1] (the share of offered calls admitted by the
            trace-id threshold). duration: the mean evaluation duration (s) or None before the
            first one finished. offered_rate: calls offered per second (None before the first
            update). max_depth: most evaluations queued or running at which a call is still
            admitted.
    """

    def __init__(self, concurrency: int, budget: float, clock: Callable[[], float] = time.monotonic, base_ratio: float = 1.0, warmup: bool = True):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not budget > 0:
            raise ValueError(f"budget must be > 0, got {budget}")
        self.concurrency = int(concurrency)
        self.budget = float(budget)
        self.base_ratio = min(1.0, max(0.0, float(base_ratio))) or 1.0
        self._clock = clock
        # the first evaluation's finish (monotonic s): evaluations started before it are cold
        self.warm_since: Optional[float] = None if warmup else -math.inf
        self.duration: Optional[float] = None  # mean duration with every slot busy
        self._duration_any: Optional[float] = None  # mean duration of any evaluation
        self.offered = 0  # calls offered (incremented under the job queue's lock)
        self.offered_rate: Optional[float] = None
        self._last_offered = 0
        self._last_update = clock()
        self.ratio = 1.0
        self.bound = _TRACE_ID_LIMIT + 1
        self.max_depth = math.inf

    # ------------------------------------------------------------------ caller side (O(1))

    def admit(self, trace_id: int, depth: int) -> Optional[str]:
        """None when a call with ``trace_id`` (0: none) may be queued behind ``depth``
        evaluations; else the reason it is shed (``sample`` or ``expected_wait``)."""
        self.offered += 1
        if depth >= self.concurrency:  # a call that starts at once is always taken
            if trace_id:
                if (trace_id & _TRACE_ID_LIMIT) >= self.bound:
                    return "sample"
            elif self.ratio < 1.0 and random.random() >= self.ratio:
                return "sample"
        if depth > 0 and depth >= self.max_depth:
            return "expected_wait"
        return None

    # ------------------------------------------------------------------ background side

    @property
    def expected_duration(self) -> float:
        """Mean seconds one evaluation takes with every slot busy (0 before any finished)."""
        d = self.duration if self.duration is not None else self._duration_any
        return d or 0.0

    @property
    def rate(self) -> Optional[float]:
        """The measured capacity in evaluations per second (None before one finished)."""
        d = self.expected_duration
        return self.concurrency / d if d > 0 else None

    def observe(self, seconds: float, busy: bool) -> None:
        """One evaluation ran for ``seconds``; ``busy``: every slot was taken when it started.
        With ``warmup``, the first evaluation to finish and those started before it finished
        are not measured (they include loading the models)."""
        seconds = max(0.0, float(seconds))
        now = self._clock()
        if self.warm_since is None:
            self.warm_since = now
            return
        if now - seconds < self.warm_since:
            return
        self._duration_any = seconds if self._duration_any is None else self._duration_any + ALPHA * (seconds - self._duration_any)
        if busy:
            self.duration = seconds if self.duration is None else self.duration + ALPHA * (seconds - self.duration)
        self._limit()

    def update(self) -> None:
        """Refresh the offered rate and the effective sample ratio (called about once a second)."""
        now = self._clock()
        elapsed = now - self._last_update
        if elapsed <= 0:
            return
        offered = self.offered
        # the first estimate spans at least MIN_SPAN: two calls a few milliseconds after the
        # start are not a rate of hundreds a second (that would shed nearly every call)
        instant = (offered - self._last_offered) / (elapsed if self.offered_rate is not None else max(elapsed, MIN_SPAN))
        self._last_offered, self._last_update = offered, now
        weight = 1.0 - math.exp(-elapsed / WINDOW)
        self.offered_rate = instant if self.offered_rate is None else self.offered_rate + weight * (instant - self.offered_rate)
        capacity = self.rate
        if capacity is None or not self.offered_rate:
            ratio = 1.0
        else:
            ratio = min(1.0, HEADROOM * capacity / self.offered_rate)
        self.ratio = ratio
        self.bound = round(ratio * self.base_ratio * (_TRACE_ID_LIMIT + 1))
        self._limit()

    def _limit(self) -> None:
        d = self.expected_duration
        if d <= 0:
            self.max_depth = math.inf
        elif d > self.budget * SAFETY:
            self.max_depth = 1  # only an idle scorer takes a call
        else:
            self.max_depth = max(1, math.floor(self.concurrency * self.budget * SAFETY / d))

    def expected_finish(self, ahead: int) -> float:
        """Expected seconds until a call with ``ahead`` (>= 0) evaluations queued or running
        before it has its result: ``D * max(1, (ahead + 1) / concurrency)`` (0 before any
        evaluation was measured)."""
        return self.expected_duration * max(1.0, (max(0, ahead) + 1) / self.concurrency)

    def worth_starting(self, remaining: float, idle: bool) -> bool:
        """Whether a queued evaluation with ``remaining`` seconds until its result is no longer
        useful (its ``due``) should start: it can still finish in time, or the scorer is
        ``idle`` (nothing else runs or waits: the evaluation keeps the measurement going, and a
        late result goes on the EVALUATOR span)."""
        return idle or remaining >= self.expected_duration
