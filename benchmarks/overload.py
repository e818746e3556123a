"""The scorer under overload (issue 37): scored rate against capacity, timeouts, shed calls, the
app's p99, at offered rates from half to ten times the capacity measured in the same run.

Each variant runs in its own child process, with the tracer's default settings (``attach``
``answer_span``, ``hold_timeout`` 60 s, ``evaluation_timeout`` 120 s, ``concurrency`` 4,
``sample_ratio`` 1) and an SDK TracerProvider with no exporter (real trace ids, spans dropped):

1. **Capacity.** The queue is kept full (``2 x concurrency`` calls outstanding, no deadline:
   ``hold_timeout`` and ``evaluation_timeout`` 3600 s, no admission control) for
   ``--calibrate-seconds`` and until ``--calibrate-evaluations`` have finished; capacity is the
   evaluations finished per second between the first and the last one finished. The calls
   still outstanding are then finished (not cancelled: a model host would go on computing
   them into the first phase).
2. **Phases.** The tracer is configured again with the defaults; for each factor of
   ``--factors`` (default 0.5, 1, 2, 5, 10) a traced handler (about 10 ms of Python CPU work,
   as in ``benchmarks.model_host``) is called at ``factor x capacity`` calls per second, at a
   fixed period, for ``--seconds``. Phases follow each other without a pause (a phase's late
   evaluations compete with the next one's, as under a real load change); every call's outcome
   (the ``on_result`` hook) is counted in the phase that offered it, after a final flush.

Reported per phase: calls offered, their outcomes by status (and how many of the scored ones
came after the hold, on the linked EVALUATOR span), the scored rate (evaluations scored while
the phase ran, per second) and its ratio to the capacity, share ``timeout``, share shed (``capacity``), the
handler's p50 / p99 wall time, the admission's effective sample ratio and measured capacity at
the phase's end, and the machine's 1-minute load average before and after.

Variants (``--variants``): ``paced-host`` (the scripted chat model of
``benchmarks.model_host`` in the model host, one request at a time after ``--pace`` seconds,
asleep: about the embedded model's pace; loads no model) and ``default`` (the embedded
default: run it under the model lock with ``OMP_WAIT_POLICY=PASSIVE``). The model host is
shared per model set and machine: a ``paced-host`` host left by an earlier run (its idle
timeout is 60 s) keeps the pace it started with::

    python -m benchmarks.overload --variants paced-host --out benchmarks/results/overload.json
    OMP_WAIT_POLICY=PASSIVE flock /tmp/relevancy-model.lock python -m benchmarks.overload --variants default --seconds 150 --calibrate-seconds 120 --merge --out benchmarks/results/overload.json

Exit status 1 when a phase at 5x or more scores less than 0.9 of the capacity, or any call
ends ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .model_host import PAIRS, SCRIPTED, WARM, calibrate, percentile, spin

ROOT = Path(__file__).resolve().parent.parent

VARIANTS: dict[str, dict] = {
    "paced-host": dict(SCRIPTED, llm_model="paced-host-chat"),
    "default": dict(),
}


class Outcomes:
    """Final outcomes by trace id (the ``on_result`` hook), with an event per arrival."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.by_trace: dict[str, tuple[str, float]] = {}  # trace id -> (status, monotonic time)
        self.finished_at: list[float] = []

    def __call__(self, outcome: Any) -> None:
        now = time.monotonic()
        with self.lock:
            self.by_trace[outcome.trace_id] = (outcome.status, now)
            self.finished_at.append(now)
            self.lock.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: len(self.by_trace) >= count, timeout)


def configure(variant: str, outcomes: Outcomes, **overrides: Any) -> None:
    import relevancy_tracer

    options = dict(llm="local", embeddings="local", setup_otel=False, on_result=outcomes)
    options.update(VARIANTS[variant])
    if variant == "paced-host":  # the scripted models, registered in this process and its hosts
        from relevancy_tracer_testing import use_scripted_host_models

        use_scripted_host_models()
    options.update(overrides)
    relevancy_tracer.configure(**options)


def child(variant: str, factors: list[float], seconds: float, calibrate_seconds: float, n: int, calibrate_evaluations: int = 12) -> dict:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())  # real trace ids, no exporter
    import relevancy_tracer
    from relevancy_tracer import lifecycle

    outcomes = Outcomes()
    phase_of: dict[str, str] = {}
    returned_at: dict[str, float] = {}  # trace id -> when the call returned (monotonic)

    answers = dict(PAIRS + [WARM])

    @relevancy_tracer.trace(name="handler")
    def handler(question: str) -> str:
        spin(n)
        return answers[question.split(" (")[0]]

    def call(question: str, phase: str, number: int = 0) -> float:
        if number:  # every call a new question: no step is answered from the question cache
            question = f"{question} (request {number})"
        began = time.perf_counter()
        trace_id = []

        def traced() -> None:
            handler(question)

        with trace.get_tracer("bench").start_as_current_span("request") as request:
            trace_id.append(format(request.get_span_context().trace_id, "032x"))
            phase_of[trace_id[0]] = phase  # before the call: its outcome may come at once
            traced()
        took = time.perf_counter() - began
        returned_at[trace_id[0]] = time.monotonic()
        return took

    # 1. capacity, with the queue kept full, no deadline and no admission control
    configure(variant, outcomes, hold_timeout=3600.0, evaluation_timeout=3600.0)
    lifecycle.current().jobs.capacity = None
    call(WARM[0], "warm-up")
    if not outcomes.wait(1, 900):
        raise SystemExit("the warm-up evaluation did not finish")
    concurrency = lifecycle.current().settings.concurrency
    offered = 1
    start = time.monotonic()
    first_done = len(outcomes.finished_at)
    i = 0
    while time.monotonic() - start < calibrate_seconds or len(outcomes.finished_at) - first_done < calibrate_evaluations:
        with outcomes.lock:
            outcomes.lock.wait_for(lambda: offered - len(outcomes.by_trace) < 2 * concurrency, 1.0)
        while offered - len(outcomes.by_trace) < 2 * concurrency:
            call(PAIRS[i % len(PAIRS)][0], "capacity", i + 1)
            offered += 1
            i += 1
    with outcomes.lock:
        done = outcomes.finished_at[first_done:]
    capacity = (len(done) - 1) / (done[-1] - done[0]) if len(done) >= 2 and done[-1] > done[0] else None
    if not capacity:
        raise SystemExit("capacity: fewer than two evaluations finished; raise --calibrate-seconds")

    relevancy_tracer.flush(3600)  # the outstanding calls: finished, not left running in the host

    # 2. phases at multiples of it, default settings
    configure(variant, outcomes)
    hold = lifecycle.current().settings.hold_timeout
    runtime = lifecycle.current()
    phases = []
    for factor in factors:
        name = f"{factor:g}x"
        period = 1.0 / (factor * capacity)
        times = []
        load_before = os.getloadavg()[0]
        window_start = time.monotonic()
        begun = time.perf_counter()
        k = 0
        while True:
            target = begun + k * period
            if target - begun >= seconds:
                break
            delay = target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            times.append(call(PAIRS[(i + k) % len(PAIRS)][0], name, i + k + 1))
            k += 1
        i += k
        phases.append({"phase": name, "window": (window_start, time.monotonic()), "factor": factor, "offered_rate": round(factor * capacity, 4), "calls": k, "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2), "sample_ratio_at_end": round(runtime.capacity.ratio, 4), "capacity_estimate_at_end": round(runtime.capacity.rate or 0.0, 4), "p50_ms": round(statistics.median(times) * 1000, 2), "p99_ms": round(percentile([t * 1000 for t in times], 99), 2)})
        print(json.dumps({k: v for k, v in phases[-1].items() if k != "window"}), file=sys.stderr, flush=True)
    flushed = relevancy_tracer.flush(600)
    relevancy_tracer.shutdown(5.0)
    rows = []
    for phase in phases:
        traces = [t for t, p in phase_of.items() if p == phase["phase"]]
        statuses = Counter(outcomes.by_trace.get(t, ("missing", 0.0))[0] for t in traces)
        start_t, end_t = phase.pop("window")
        finished_in_window = sum(1 for status, at in outcomes.by_trace.values() if status == "scored" and start_t <= at < end_t)
        late = sum(1 for t in traces if outcomes.by_trace.get(t, ("", 0.0))[0] == "scored" and outcomes.by_trace[t][1] - returned_at.get(t, 0.0) > hold)
        calls = phase["calls"]
        scored = statuses.get("scored", 0)
        rows.append(dict(
            phase,
            statuses=dict(statuses),
            scored_after_hold=late,
            scored_of_offered=scored,
            scored_rate=round(finished_in_window / (end_t - start_t), 4),
            scored_vs_capacity=round(finished_in_window / (end_t - start_t) / capacity, 3),
            share_timeout=round(statuses.get("timeout", 0) / calls, 3) if calls else 0.0,
            share_shed=round(statuses.get("capacity", 0) / calls, 3) if calls else 0.0,
        ))
    return {"variant": variant, "capacity_per_s": round(capacity, 4), "calibrate_seconds": calibrate_seconds, "capacity_evaluations": len(done), "seconds_per_phase": seconds, "concurrency": concurrency, "flushed": flushed, "cpus": os.cpu_count(), "phases": rows}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2], [float(f) for f in sys.argv[3].split(",")], float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="paced-host", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--factors", default="0.5,1,2,5,10", help="offered rates as multiples of the measured capacity")
    parser.add_argument("--seconds", type=float, default=180.0, help="seconds per phase")
    parser.add_argument("--calibrate-seconds", type=float, default=90.0, help="least seconds of the capacity measurement")
    parser.add_argument("--calibrate-evaluations", type=int, default=12, help="least evaluations finished in the capacity measurement")
    parser.add_argument("--pace", type=float, default=2.5, help="seconds per chat request of the paced-host variant's scripted model")
    parser.add_argument("--out", help="write the results as JSON")
    parser.add_argument("--merge", action="store_true", help="keep the other variants already in --out")
    args = parser.parse_args()
    n = calibrate()
    results: dict[str, Any] = {}
    if args.merge and args.out and Path(args.out).exists():
        results = json.loads(Path(args.out).read_text(encoding="utf-8")).get("variants", {})
    ok = True
    for variant in args.variants.split(","):
        env = dict(os.environ, MODEL_HOST_BENCH_PACE=str(args.pace))
        out = subprocess.run([sys.executable, "-m", "benchmarks.overload", "child", variant, args.factors, str(args.seconds), str(args.calibrate_seconds), str(n), str(args.calibrate_evaluations)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed (exit {out.returncode})")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        if variant == "paced-host":
            row["pace_s"] = args.pace
        results[variant] = row
        for phase in row["phases"]:
            if phase["statuses"].get("timeout") or (phase["factor"] >= 5 and phase["scored_vs_capacity"] < 0.9):
                ok = False
    result = {"benchmark": "overload", "command": " ".join(["python -m benchmarks.overload"] + sys.argv[1:]), "variants": results}
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
