"""The background worker with scripted jobs: bounds, deadlines, flush/shutdown, fork."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from relevancy_tracer.result import Status
from relevancy_tracer._background.jobqueue import JobQueue


class FakeJob:
    def __init__(self, *, work: float = 0.0, hang: bool = False, fail: bool = False, hold: float = 60.0, timeout: float = 60.0, gate: "threading.Event | None" = None):
        self.work, self.hang, self.fail, self.gate = work, hang, fail, gate
        self.deadline = time.monotonic() + hold
        self.timeout = timeout
        self.finished: list = []
        self.started = threading.Event()

    async def run(self):
        self.started.set()
        if self.hang:
            await asyncio.Event().wait()
        if self.gate is not None:
            while not self.gate.is_set():
                await asyncio.sleep(0.01)
        if self.work:
            await asyncio.sleep(self.work)
        if self.fail:
            raise RuntimeError("job bug")
        self.finish(Status.SCORED)

    def finish(self, status, error=None, reason=None):
        self.finished.append((status, reason))


def test_runs_jobs_and_flush_waits_for_them():
    worker = JobQueue(queue_size=10, concurrency=2)
    jobs = [FakeJob(work=0.05) for _ in range(5)]
    assert all(worker.submit(j) for j in jobs)
    assert worker.flush(5) and worker.depth == 0
    assert [j.finished for j in jobs] == [[(Status.SCORED, None)]] * 5
    assert worker.shutdown(1)


def test_submit_never_blocks_and_drops_when_full():
    worker = JobQueue(queue_size=3, concurrency=1)
    jobs = [FakeJob(hang=True) for _ in range(10)]
    accepted = [worker.submit(j) for j in jobs]
    assert jobs[0].started.wait(5)
    assert 3 <= sum(accepted) <= 4 and not all(accepted)
    for job, ok in zip(jobs, accepted):
        if not ok:
            assert job.finished == [(Status.DROPPED, "queue_full")]
    assert worker.shutdown(0.2) is False
    assert all(len(j.finished) == 1 for j in jobs)  # every job finished exactly once
    assert sorted({j.finished[0][0] for j in jobs}) == [Status.DROPPED, Status.SHUTDOWN]
    late = FakeJob()
    assert worker.submit(late) is False and late.finished == [(Status.DROPPED, "shutdown")]


def test_concurrency_limit():
    worker = JobQueue(queue_size=100, concurrency=3)
    running, peak, lock = [0], [0], threading.Lock()

    class Counting(FakeJob):
        async def run(self):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.02)
            with lock:
                running[0] -= 1
            self.finish(Status.SCORED)

    for _ in range(20):
        worker.submit(Counting())
    assert worker.flush(5) and peak[0] == 3
    worker.shutdown(1)


def test_running_job_deadline_and_queued_job_expiry():
    """A running job past evaluation_timeout ends timeout; a queued one whose deadline passes
    was never started: it ends capacity (reason deadline), not timeout (issue 37)."""
    worker = JobQueue(queue_size=10, concurrency=1)
    slow = FakeJob(hang=True, timeout=0.2)
    waiting = FakeJob(hold=0.1)
    worker.submit(slow)
    worker.submit(waiting)
    assert worker.flush(5)
    assert slow.finished == [(Status.TIMEOUT, "evaluation_timeout")] and waiting.finished == [(Status.CAPACITY, "deadline")]
    assert not waiting.started.is_set()
    worker.shutdown(1)


def test_failing_job_is_an_error_and_the_worker_survives():
    worker = JobQueue(queue_size=10, concurrency=1)
    bad, good = FakeJob(fail=True), FakeJob()
    worker.submit(bad)
    worker.submit(good)
    assert worker.flush(5)
    assert bad.finished[0][0] == Status.ERROR and good.finished == [(Status.SCORED, None)]
    worker.shutdown(1)


def test_flush_times_out_and_shutdown_finishes_everything():
    worker = JobQueue(queue_size=10, concurrency=1)
    gate = threading.Event()
    jobs = [FakeJob(gate=gate) for _ in range(3)]
    for job in jobs:
        worker.submit(job)
    assert worker.flush(0.1) is False
    gate.set()
    assert worker.shutdown(5) is True
    assert [j.finished[0][0] for j in jobs] == [Status.SCORED] * 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_worker_restarts_in_a_forked_child():
    worker = JobQueue(queue_size=10, concurrency=1)
    parent_job = FakeJob(work=0.01)
    worker.submit(parent_job)
    assert worker.flush(5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the worker must work again, with a fresh thread
        try:
            job = FakeJob(work=0.01)
            ok = worker.submit(job) and worker.flush(5) and job.finished == [(Status.SCORED, None)]
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 2) == b"ok"
    os.waitpid(pid, 0)
    again = FakeJob()
    assert worker.submit(again) and worker.flush(5) and again.finished == [(Status.SCORED, None)]
    worker.shutdown(1)
