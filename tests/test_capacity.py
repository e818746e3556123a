"""Admission by capacity (issue 37): the scorer takes what it can finish in time, sheds the rest at
once with status ``capacity``, keeps the admitted calls a fair sample on the trace id, never
starts a job that can no longer finish, and never throws away a result that comes after the
answer span's hold. Slowness is scripted (a gate the test opens), never timed."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

import relevancy_tracer
from relevancy_tracer._background.capacity import HEADROOM, Capacity
from relevancy_tracer._background.jobqueue import JobQueue
from relevancy_tracer.otel import attributes as A
from relevancy_tracer.result import Status
from relevancy_tracer.tracing import lifecycle
from relevancy_tracer_testing import Gate, Hang

from .conftest import finished_spans

QUESTION = "Where is France and what is its capital?"
ANSWER = "France is in western Europe and Paris is its capital."
LOW64 = (1 << 64) - 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def overloaded(clock: Clock, *, concurrency: int = 2, duration: float = 10.0, offered_per_s: float = 10.0) -> Capacity:
    """A controller that measured ``duration`` s per evaluation with every slot busy and
    ``offered_per_s`` calls a second for a minute."""
    capacity = Capacity(concurrency, 60.0, clock=clock, warmup=False)
    capacity.observe(duration, busy=True)
    for _ in range(60):
        clock.now += 1.0
        capacity.offered += int(offered_per_s)
        capacity.update()
    return capacity


@hypothesis_settings(max_examples=300, deadline=None)
@given(trace_id=st.integers(min_value=1, max_value=(1 << 128) - 1))
def test_the_admitted_calls_are_those_below_the_trace_id_threshold(trace_id):
    capacity = overloaded(Clock())
    # capacity 2 / 10 s = 0.2/s against 10 offered/s: ratio = headroom x 0.02
    assert capacity.rate == pytest.approx(0.2) and capacity.ratio == pytest.approx(HEADROOM * 0.02, rel=0.01)
    verdict = capacity.admit(trace_id, depth=capacity.concurrency)  # every slot busy
    below = (trace_id & LOW64) < capacity.ratio * 2**64
    assert (verdict is None) == below and verdict in (None, "sample")


def test_the_admitted_share_follows_the_measured_capacity_and_recovers():
    clock = Clock()
    capacity = overloaded(clock)
    import random

    rng = random.Random(7)
    ids = [rng.getrandbits(128) or 1 for _ in range(20000)]
    busy = capacity.concurrency
    admitted = sum(capacity.admit(t, busy) is None for t in ids)
    assert admitted / len(ids) == pytest.approx(capacity.ratio, rel=0.15)
    # the same trace id gets the same decision in every process that measured the same
    assert [capacity.admit(t, busy) for t in ids[:50]] == [capacity.admit(t, busy) for t in ids[:50]]
    # the load falls under the capacity: every call is admitted again
    for _ in range(120):
        clock.now += 1.0
        capacity.offered += 0
        capacity.update()
    assert capacity.ratio == 1.0 and all(capacity.admit(t, busy) is None for t in ids[:100])


def test_two_calls_right_after_the_start_are_not_an_overload():
    """The first offered-rate estimate spans at least a second: two calls 10 ms after the
    controller started, against a measured 5 evaluations/s, leave the ratio at 1 (taken over
    10 ms they were 200 calls/s, a ratio of 0.03 that shed the second call of
    test_an_admitted_call_still_queued_at_the_end_of_its_hold_is_deferred_and_scored in CI).
    A sustained rate is still measured as such."""
    clock = Clock()
    capacity = Capacity(1, 0.5, clock=clock, warmup=False)
    capacity.observe(0.2, busy=True)
    capacity.offered += 2
    clock.now += 0.01
    capacity.update()
    assert capacity.ratio == 1.0 and capacity.offered_rate == pytest.approx(2.0)
    for _ in range(100):  # then 50 calls a second for 100 s: 10x the capacity
        for _ in range(5):
            clock.now += 0.1
            capacity.offered += 5
            capacity.update()
    assert capacity.offered_rate == pytest.approx(50.0, rel=0.01) and capacity.ratio == pytest.approx(HEADROOM * 5 / 50, rel=0.02)


def test_the_threshold_nests_in_the_sample_ratio_the_calls_were_sampled_at():
    """With sample_ratio 0.1 every offered call is under 0.1 * 2**64: the admission's threshold
    is a share of that range, so it still sheds (a threshold on the raw range would admit all)."""
    import random

    clock = Clock()
    capacity = Capacity(2, 60.0, clock=clock, base_ratio=0.1, warmup=False)
    capacity.observe(10.0, busy=True)
    for _ in range(60):
        clock.now += 1.0
        capacity.offered += 1  # 1 offered/s against 0.2/s: ratio 0.22
        capacity.update()
    rng = random.Random(5)
    offered = [rng.randrange(1, int(0.1 * 2**64)) for _ in range(20000)]  # what the ratio sampler let through
    admitted = sum(capacity.admit(t, 2) is None for t in offered)
    assert admitted / len(offered) == pytest.approx(capacity.ratio, rel=0.1) and capacity.ratio < 0.5


def test_expected_wait_bounds_the_depth_but_an_idle_scorer_always_takes_a_call():
    capacity = Capacity(4, 60.0, warmup=False)
    assert capacity.admit(1, 10**6) is None  # nothing measured yet: no bound
    capacity.observe(20.0, busy=True)  # 4 slots, 20 s each: 0.2/s; 60 s * 0.9 fits 10 evaluations
    assert capacity.max_depth == 10
    assert capacity.admit(1, 9) is None and capacity.admit(1, 10) == "expected_wait"
    capacity.observe(1000.0, busy=True)  # slower than the budget: only an idle scorer takes one
    assert capacity.admit(1, 0) is None and capacity.admit(1, 1) == "expected_wait"


def test_a_call_that_can_start_at_once_is_taken_whatever_its_trace_id():
    """A burst on a scorer with free slots waits for nothing: the trace-id threshold applies
    only while every slot is busy (fails when the threshold is applied at any depth)."""
    capacity = overloaded(Clock(), concurrency=4)
    outside = [t for t in range(1, 1 << 20, 4099) if t << 40 >= capacity.bound][:20]
    assert outside and capacity.ratio < 0.1
    outside = [t << 40 for t in outside]
    assert all(capacity.admit(t, depth) is None for t in outside for depth in range(4))
    assert all(capacity.admit(t, 4) == "sample" for t in outside)


def test_the_first_evaluation_loads_the_models_and_is_not_measured():
    """A cold start (the host loading its weights) took 200 s for the first evaluation and the
    one started with it; warm evaluations take 10 s. A burst right after the cold ones is admitted (no bound yet: fails when the cold duration is
    measured, which allows only an idle scorer to take a call), and the warm ones set the bound."""
    clock = Clock()
    capacity = Capacity(2, 60.0, clock=clock)
    clock.now += 200.0
    capacity.observe(200.0, busy=False)
    clock.now += 20.0
    capacity.observe(210.0, busy=False)  # started with the first: cold too
    assert capacity.rate is None and capacity.max_depth == math.inf
    assert all(capacity.admit(1, depth) is None for depth in range(6))
    capacity.observe(10.0, busy=True)  # started after the first finished: warm
    assert capacity.rate == pytest.approx(0.2) and capacity.max_depth == 10  # 2 slots x 60 s x 0.9 / 10 s


class FakeJob:
    """A job whose run waits for a threading.Event the test sets."""

    def __init__(self, deadline: float, gate: threading.Event = None, trace_id: int = 0, name: str = "hold_timeout", limit: float = 60.0):
        self.deadline = deadline
        self.deadline_name = name
        self.deadline_limit = limit
        self.timeout = 600.0
        self.deferrable = False
        self.trace_id = trace_id
        self.gate = gate
        self.started = threading.Event()
        self.outcome = None
        self.done = threading.Event()

    async def run(self) -> None:
        self.started.set()
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 30)
        self.finish(Status.SCORED)

    def finish(self, status, error=None, reason=None) -> None:
        if self.outcome is None:
            self.outcome = (status, error, reason)
            self.done.set()

    def defer(self) -> None:  # pragma: no cover - not deferrable
        raise AssertionError


def test_a_queued_job_that_can_no_longer_finish_is_not_started():
    capacity = Capacity(1, 600.0, warmup=False)
    capacity.observe(100.0, busy=True)  # one evaluation takes 100 s
    queue = JobQueue(queue_size=10, concurrency=1, capacity=capacity)
    gate = threading.Event()
    try:
        running = FakeJob(math.inf, gate)
        late = FakeJob(time.monotonic() + 50.0, name="hold_timeout", limit=50.0)  # due in 50 s: cannot fit 100 s
        patient = FakeJob(math.inf)
        assert queue.submit(running) and queue.submit(late) and queue.submit(patient)
        assert running.started.wait(10)
        gate.set()
        assert queue.flush(10)
        assert running.outcome[0] == patient.outcome[0] == Status.SCORED
        assert not late.started.is_set()  # never started: no model time spent on it
        status, error, reason = late.outcome
        assert status == Status.CAPACITY and reason == "deadline" and "hold_timeout (50 s)" in error
    finally:
        gate.set()
        queue.shutdown(5)


def test_the_queue_admits_by_trace_id_and_sheds_at_once():
    clock = Clock()
    capacity = overloaded(clock, concurrency=1)
    queue = JobQueue(queue_size=1000, concurrency=1, capacity=capacity)
    gate = threading.Event()
    try:
        import random

        rng = random.Random(3)
        jobs = [FakeJob(math.inf, gate, trace_id=rng.getrandbits(128) or 1) for _ in range(400)]
        taken = [queue.submit(job) for job in jobs]
        bound = capacity.ratio * 2**64
        assert taken[0] and jobs[0].outcome is None  # a free slot takes any call
        for job, ok in zip(jobs[1:], taken[1:]):
            if (job.trace_id & LOW64) >= bound:  # outside the sample: ended at once, before any ran
                assert not ok and job.outcome[0] == Status.CAPACITY and job.outcome[2] == "sample"
            elif ok:
                assert job.outcome is None
            else:  # inside the sample but the queue was full for its budget
                assert job.outcome[0] == Status.CAPACITY and job.outcome[2] == "expected_wait"
        assert 0 < sum(taken) <= capacity.max_depth
        gate.set()
        assert queue.flush(30)
        assert all(job.outcome[0] == Status.SCORED for job, ok in zip(jobs, taken) if ok)
    finally:
        gate.set()
        queue.shutdown(5)


def test_the_effective_sample_ratio_is_a_metric():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from relevancy_tracer.otel.metrics import RelevancyMetrics

    reader = InMemoryMetricReader()
    metrics = RelevancyMetrics("svc", lambda: 0, meter_provider=MeterProvider(metric_readers=[reader]))
    metrics.admission = overloaded(Clock())
    points = {m.name: m.data.data_points[0].value for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.data.data_points}
    assert points[A.METRIC_SAMPLE_RATIO] == pytest.approx(HEADROOM * 0.02, rel=0.01)
    assert points[A.METRIC_CAPACITY] == pytest.approx(0.2)


# ------------------------------------------------------------------------------ the tracer


def test_calls_over_capacity_end_at_once_with_status_capacity_never_timeout(tracing, otel, server):
    tracing(concurrency=1, hold_timeout=30.0)
    capacity = lifecycle.current().capacity
    clock = Clock()
    clock.now = capacity._last_update
    capacity._clock = clock  # no call offered while it moves: only the expected wait sheds
    capacity.observe(30.0, busy=True)  # the first evaluation loads the models: not measured
    assert capacity.duration is None and capacity.max_depth == math.inf
    clock.now += 20.0
    capacity.observe(20.0, busy=True)  # 20 s each: one evaluation fits 30 s
    gate = threading.Event()
    server.chat.push(Gate(gate))

    @relevancy_tracer.trace(name="shed")
    def answer(question):
        return ANSWER

    try:
        assert [answer(QUESTION) for _ in range(5)] == [ANSWER] * 5
        shed = finished_spans(otel, "shed")  # ended before any evaluation finished
        assert len(shed) == 4
        for span in shed:
            a = dict(span.attributes)
            assert a[A.STATUS] == "capacity" and a[A.STATUS_REASON] == "expected_wait" and A.SCORE not in a
    finally:
        gate.set()
    assert relevancy_tracer.flush(10)
    statuses = sorted(dict(s.attributes)[A.STATUS] for s in finished_spans(otel, "shed"))
    assert statuses == ["capacity"] * 4 + ["scored"]
    counts = lifecycle.current().metrics.counts()
    assert sum(n for key, n in counts.items() if key[0] == "shed" and key[1] == "capacity" and key[3] == "expected_wait") == 4
    assert not any(key[0] == "shed" and key[1] == "timeout" for key in counts)


def test_a_result_after_the_hold_goes_on_a_linked_evaluator_span(tracing, otel, server):
    tracing(concurrency=1, hold_timeout=2.0, evaluation_timeout=60.0)
    gate = threading.Event()
    server.chat.push(Gate(gate))

    @relevancy_tracer.trace(name="late")
    def answer(question):
        return ANSWER

    try:
        answer(QUESTION)
        assert otel.ledger.wait_ended("late", 1, 30)  # the hold ended; the model is still busy
        (span,) = finished_spans(otel, "late")
        a = dict(span.attributes)
        assert a[A.STATUS] == "deferred" and a[A.STATUS_REASON] == "hold_timeout" and A.SCORE not in a
    finally:
        gate.set()
    assert relevancy_tracer.flush(30)
    (evaluator,) = finished_spans(otel, A.EVALUATION_NAME)
    e = dict(evaluator.attributes)
    assert e[A.OPENINFERENCE_SPAN_KIND] == "EVALUATOR" and e[A.STATUS] == "scored" and 0.0 <= e[A.SCORE] <= 1.0
    assert evaluator.parent.span_id == span.context.span_id and evaluator.links[0].context.span_id == span.context.span_id
    assert e[A.EVALUATION_ID] == a[A.EVALUATION_ID] and e[A.STATUS_REASON] == "hold_timeout"
    assert len(finished_spans(otel, "late")) == 1  # the answer span ended once
    assert not any(key[1] == "timeout" for key in lifecycle.current().metrics.counts() if key[0] == "late")


def measured(capacity: Capacity, seconds: float) -> None:
    """Make ``capacity`` have measured ``seconds`` per warm evaluation with every slot busy."""
    capacity.warm_since = -math.inf
    capacity.observe(seconds, busy=True)


def test_the_error_names_the_limit_that_applied(tracing, otel, server):
    """The first call hangs: deferred at the 0.5 s hold, then past evaluation_timeout. The second
    was admitted (0.2 s measured per evaluation), but at the end of its hold it still waits,
    and it cannot be scored within evaluation_timeout (0.6 s) of the call: it ends there,
    ``capacity``, reason ``deadline``, on its answer span."""
    tracing(concurrency=1, hold_timeout=0.5, evaluation_timeout=0.6, capture_content=True)
    measured(lifecycle.current().capacity, 0.2)
    server.chat.push(Hang())

    @relevancy_tracer.trace(name="limits")
    def answer(question):
        return ANSWER

    answer(QUESTION)  # runs (hangs): deferred at the hold, then past evaluation_timeout
    answer(QUESTION)  # queued behind it: cannot be scored in time
    assert relevancy_tracer.flush(10)
    spans = {dict(s.attributes)[A.STATUS]: dict(s.attributes) for s in finished_spans(otel, "limits")}
    assert sorted(spans) == ["capacity", "deferred"]
    assert spans["capacity"][A.STATUS_REASON] == "deadline" and "hold_timeout (0.5 s)" in spans["capacity"][A.ERROR]
    assert spans["deferred"][A.STATUS_REASON] == "hold_timeout" and "hold_timeout (0.5 s)" in spans["deferred"][A.ERROR]
    (evaluator,) = finished_spans(otel, A.EVALUATION_NAME)
    e = dict(evaluator.attributes)
    assert e[A.STATUS] == "timeout" and e[A.STATUS_REASON] == "evaluation_timeout" and "evaluation_timeout (0.6 s)" in e[A.ERROR]


def test_an_admitted_call_still_queued_at_the_end_of_its_hold_is_deferred_and_scored(tracing, otel, server):
    """Admitted work is finished (issue 37: the gunicorn burst): the admission expected the
    second call to be scored within its hold, but the first evaluation is slow (a gate). At the
    end of the hold the second still waits: its answer span ends ``deferred`` (not
    ``capacity``), and once the first finishes it is scored on its EVALUATOR span, within
    evaluation_timeout of the call. Fails when a queued call is shed at the end of its hold."""
    tracing(concurrency=1, hold_timeout=0.5, evaluation_timeout=60.0)
    measured(lifecycle.current().capacity, 0.2)
    gate = threading.Event()
    server.chat.push(Gate(gate))

    @relevancy_tracer.trace(name="queued")
    def answer(question):
        return ANSWER

    try:
        answer(QUESTION)
        answer(QUESTION)
        assert otel.ledger.wait_ended("queued", 2, 30)  # both holds ended; the first still runs
        held = [dict(s.attributes) for s in finished_spans(otel, "queued")]
        assert [a[A.STATUS] for a in held] == ["deferred", "deferred"] and not finished_spans(otel, A.EVALUATION_NAME)
    finally:
        gate.set()
    assert relevancy_tracer.flush(30)
    evaluators = [dict(s.attributes) for s in finished_spans(otel, A.EVALUATION_NAME)]
    assert sorted(e[A.STATUS] for e in evaluators) == ["scored", "scored"]
    assert sorted(e[A.EVALUATION_ID] for e in evaluators) == sorted(a[A.EVALUATION_ID] for a in held)
    assert not any(key[1] in ("capacity", "timeout") for key in lifecycle.current().metrics.counts() if key[0] == "queued")


class DeferrableJob(FakeJob):
    """A FakeJob with a hold (``deadline``) and a later ``due``, recording when it was deferred."""

    def __init__(self, hold: float, due: float) -> None:
        now = time.monotonic()
        super().__init__(now + hold, name="hold_timeout", limit=hold)
        self.deferrable = True
        self.due, self.due_name, self.due_limit = now + due, "evaluation_timeout", due
        self.deferred = threading.Event()
        self.deferred_while_queued = None

    def defer(self) -> None:
        self.deferred_while_queued = not self.started.is_set()
        self.deferred.set()


def test_a_queued_deferrable_job_is_deferred_at_its_hold_and_not_started_after_its_due():
    """The queue tells a waiting job its hold ended (its answer span ends ``deferred``), keeps
    it queued while it can still be useful, and ends it, never started, at its ``due``, the
    error naming the limit that applied then."""
    queue = JobQueue(queue_size=10, concurrency=1)
    gate = threading.Event()
    try:
        running = FakeJob(math.inf, gate)
        waiting = DeferrableJob(hold=0.2, due=0.8)
        assert queue.submit(running) and queue.submit(waiting)
        assert running.started.wait(10)
        assert waiting.deferred.wait(10) and waiting.deferred_while_queued and waiting.outcome is None
        assert waiting.done.wait(10)
        status, error, reason = waiting.outcome
        assert status == Status.CAPACITY and reason == "deadline" and "evaluation_timeout (0.8 s)" in error
        assert not waiting.started.is_set()
        gate.set()
        assert queue.flush(10) and running.outcome[0] == Status.SCORED
    finally:
        gate.set()
        queue.shutdown(5)
