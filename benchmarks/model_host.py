"""The model host against the embedded model in the app's process (issue 26).

Two benchmarks, each variant in its own child process, figures as ratios within one run:

``latency``: an app handler doing about 10 ms of Python CPU work (a calibrated loop, traced by
``@relevancy_tracer.trace``, sample ratio 1) is called every 50 ms for ``--seconds``; every call
queues an evaluation, so the local scorer is saturated. The handler's wall time per call
(``time.perf_counter``) gives p50 / p99. Variants (``--variants``, run in that order,
``--rounds`` times): ``off`` (``sample_ratio=0``: no scoring), ``in-process``
(``local_host=false``), ``host-nice`` (the host at nice 19 without ``SCHED_IDLE``), ``host``
(the default: nice 19 and ``SCHED_IDLE``), and two that load no model, to measure the tracer's
own work in the app's process apart from the model's CPU: ``scripted-host`` (the scripted
models of ``relevancy_tracer_testing`` in the host, answering at once: the app's worker scores
as fast as it can) and ``paced-host`` (the scripted chat model answering one request at a time
after ``--pace`` seconds, asleep: about the embedded model's rate). The scorer's model is
loaded and warm before timing starts. Reported per variant: p50 / p99 / max, evaluations
finished in the window, the host's scheduling policy and nice value over all its threads, and
the app process's CPU time outside the handler (the tracer's threads) per evaluation; and p99
with scoring / p99 off of the same round.

``forked``: a parent configures the tracer with the local default, scores one answer (so the
model is loaded: in its own process in-process, in the host otherwise), then forks
``--workers`` app processes that each score ``--answers`` answers through the decorator and
flush. Reported per layout (``1x in-process``: the parent alone scores workers x answers;
``Nx in-process``; ``Nx host``): evaluations/s (answers over wall time from the fork to the
last flush), private memory (USS, psutil) of each app process and of the host, and the
llama.cpp contexts and threads on the machine: processes that map the GGUF file, and the sum
of their threads.

    python -m benchmarks.model_host latency --seconds 40 --rounds 2 --out benchmarks/results/model_host_latency.json
    python -m benchmarks.model_host latency --seconds 30 --rounds 3 --variants off,scripted-host,paced-host  # no model
    python -m benchmarks.model_host forked --workers 4 --answers 2 --out benchmarks/results/model_host_forked.json

Run one model-heavy job at a time on the machine (llama.cpp slows about tenfold when another
busy process shares the cores), with ``OMP_WAIT_POLICY=PASSIVE``.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PAIRS = [
    ("Where is France and what is its capital?", "France is in western Europe and Paris is its capital."),
    ("What does the pass statement do?", "pass is a null operation: nothing happens when it executes."),
    ("How do I open a file in Python?", "Use the built-in open() function with a path and a mode such as 'r'."),
    ("What is a Python list?", "A list is a mutable sequence that holds items in order."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare around 1600."),
    ("What is the boiling point of water?", "At sea level water boils at 100 degrees Celsius."),
    ("Why is the sky blue?", "Sunlight is scattered by air molecules, and blue light scatters the most."),
    ("What does HTTP stand for?", "HTTP stands for Hypertext Transfer Protocol."),
    ("What is photosynthesis?", "Plants turn light, water and carbon dioxide into sugar and oxygen."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is the capital of Japan?", "Tokyo is the capital of Japan."),
    ("What is a prime number?", "A prime number has exactly two divisors: 1 and itself."),
    ("What is the largest planet?", "Jupiter is the largest planet of the solar system."),
    ("What is gravity?", "Gravity is the force by which masses attract each other."),
    ("What language is spoken in Brazil?", "Portuguese is the official language of Brazil."),
    ("What is DNA?", "DNA is the molecule that carries genetic instructions in living things."),
    ("What is the speed of light?", "Light travels at about 300,000 kilometres per second in vacuum."),
]
WARM = ("What is Python?", "Python is a programming language created by Guido van Rossum.")


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def calibrate(target: float = 0.010) -> int:
    n = 20000
    while True:
        started = time.perf_counter()
        spin(n)
        took = time.perf_counter() - started
        if took > 0.05:
            return max(1, int(n * target / took))
        n *= 2


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def gguf_mapped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as handle:
            return ".gguf" in handle.read()
    except OSError:
        return False


def uss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_full_info().uss


def threads_of(pid: int) -> int:
    import psutil

    return psutil.Process(pid).num_threads()


#: The scripted models of ``relevancy_tracer_testing`` (registered by ``use_scripted_host_models``
#: in :func:`configure`; no setting can make the host load other code).
SCRIPTED = dict(llm_model="fake-host-chat", embedding_model="fake-host-embed", calibration="none")
#: Settings of each latency variant (all: local models, sample ratio 1 unless ``off``).
VARIANTS: dict[str, dict] = {
    "off": dict(sample_ratio=0.0),
    "in-process": dict(local_host=False),
    "host": dict(),
    "host-nice": dict(),  # the host at nice 19 without SCHED_IDLE (see latency_child)
    "scripted-host": SCRIPTED,
    "paced-host": dict(SCRIPTED, llm_model="paced-host-chat"),
}


def configure(variant: str, done: list, event: threading.Event):
    import relevancy_tracer

    def on_result(outcome):
        done.append(outcome.status)
        event.set()

    options = dict(local_host=True, sample_ratio=1.0)
    options.update(VARIANTS[variant])
    if variant in ("scripted-host", "paced-host"):
        from relevancy_tracer_testing import use_scripted_host_models

        use_scripted_host_models()
    relevancy_tracer.configure(
        llm="local", embeddings="local", setup_otel=False, score_unrecorded=True, local_host_idle_timeout=2.0, on_result=on_result,
        evaluation_timeout=3600, hold_timeout=3600, queue_size=10000, **options,
    )


# ----------------------------------------------------------------------------- latency


def host_scheduling(pid: int) -> dict:
    """The scheduling policy and nice value of every thread of process ``pid``."""
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE") if hasattr(os, n)}
    policies, nices = set(), set()
    tasks = os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        try:
            policies.add(names.get(os.sched_getscheduler(int(task)), "other"))
            nices.add(int(open(f"/proc/{pid}/task/{task}/stat").read().rsplit(")", 1)[1].split()[16]))
        except (OSError, ValueError):  # a thread that ended meanwhile
            pass
    return {"policies": sorted(policies), "nice": sorted(nices), "threads": len(tasks)}


def latency_child(variant: str, seconds: float, n: int, period: float) -> dict:
    import relevancy_tracer

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))
    if variant == "host-nice":  # the host's niceness alone, without SCHED_IDLE
        import dataclasses

        from relevancy_tracer.scoring import backends

        spec_of = backends.host_spec
        backends.host_spec = lambda settings: dataclasses.replace(spec_of(settings), sched_idle=False)
    done: list = []
    event = threading.Event()
    configure(variant, done, event)

    @relevancy_tracer.trace(name="handler")
    def handler(question: str) -> str:
        spin(n)
        return WARM[1]

    if variant != "off":  # load and warm the scorer's model first
        handler(WARM[0])
        if not event.wait(600):
            raise SystemExit("warm-up evaluation did not finish")
    scheduling = None
    if VARIANTS[variant].get("local_host", True) and variant != "off":
        from relevancy_tracer import lifecycle
        from relevancy_tracer.scoring.backends import host_connection

        scheduling = host_scheduling(host_connection(lifecycle.current().settings).info()["pid"])
    times = []
    handler_cpu = 0.0
    cpu_before = time.process_time()
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        target = start + i * period
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        began, began_cpu = time.perf_counter(), time.thread_time()
        handler(PAIRS[i % len(PAIRS)][0])
        times.append(time.perf_counter() - began)
        handler_cpu += time.thread_time() - began_cpu
        i += 1
    tracer_cpu = time.process_time() - cpu_before - handler_cpu  # the tracer's threads, and the app thread's sleeps' overhead
    scored_during = len(done) - (0 if variant == "off" else 1)
    relevancy_tracer.shutdown(1.0)
    ms = [t * 1000 for t in times]
    return {
        "variant": variant, "calls": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(max(ms), 2),
        "evaluations_finished": scored_during, "host_scheduling": scheduling, "app_cpu_outside_handler_s": round(tracer_cpu, 3),
        "app_cpu_ms_per_evaluation": round(tracer_cpu * 1000 / scored_during, 2) if scored_during > 0 else None,
    }


def latency(args) -> dict:
    n = calibrate()
    rounds = []
    for round_ in range(args.rounds):
        rows = {}
        for variant in args.variants.split(","):
            env = dict(os.environ, MODEL_HOST_BENCH_PACE=str(args.pace))
            out = subprocess.run([sys.executable, "-m", "benchmarks.model_host", "latency-child", variant, str(args.seconds), str(n), str(args.period)], capture_output=True, text=True, env=env, cwd=ROOT)
            if out.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
            rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(dict(rows[variant], round=round_)), flush=True)
        off = rows.get("off", {}).get("p99_ms")
        ratios = {v: round(r["p99_ms"] / off, 2) for v, r in rows.items() if off and v != "off"}
        rounds.append({"variants": rows, "p99_ratio_vs_off": ratios})
    return {"benchmark": "latency", "cpus": os.cpu_count(), "seconds": args.seconds, "period_s": args.period, "pace_s": args.pace, "spin_n": n, **rounds[0], "rounds": rounds}


# ----------------------------------------------------------------------------- forked


def forked_child(mode: str, workers: int, answers: int) -> dict:
    import relevancy_tracer
    from relevancy_tracer.tracing import lifecycle

    done: list = []
    event = threading.Event()
    configure("in-process" if mode == "in-process" else "host", done, event)

    @relevancy_tracer.trace(name="answer")
    def answer(question: str, reply: str) -> str:
        return reply

    answer(*WARM)
    if not event.wait(600):
        raise SystemExit("warm-up evaluation did not finish")
    host_pid = None
    if mode == "host":
        from relevancy_tracer.scoring.backends import host_connection

        host_pid = host_connection(lifecycle.current().settings).info()["pid"]
    pairs = iter(PAIRS)
    started = time.perf_counter()
    if workers == 1:  # the parent alone
        done.clear()
        for _ in range(answers):
            answer(*next(pairs))
        relevancy_tracer.flush(3600)
        wall = time.perf_counter() - started
        apps = [{"pid": os.getpid(), "uss_mib": round(uss(os.getpid()) / 2**20, 1), "threads": threads_of(os.getpid()), "gguf": gguf_mapped(os.getpid()), "statuses": list(done)}]
        children = []
    else:
        children = []
        release_r, release_w = os.pipe()
        for w in range(workers):
            mine = [next(pairs) for _ in range(answers)]
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(read)
                    os.close(release_w)
                    done.clear()
                    for pair in mine:
                        answer(*pair)
                    relevancy_tracer.flush(3600)
                    me = os.getpid()
                    report = {"pid": me, "finished": time.perf_counter(), "uss_mib": round(uss(me) / 2**20, 1), "threads": threads_of(me), "gguf": gguf_mapped(me), "statuses": list(done)}
                    os.write(write, json.dumps(report).encode())
                    os.close(write)
                    os.read(release_r, 1)  # stay alive until the parent has measured the host
                finally:
                    os._exit(0)
            os.close(write)
            children.append((pid, read))
        apps = []
        for pid, read in children:
            chunks = b""
            while True:
                chunk = os.read(read, 65536)
                if not chunk:
                    break
                chunks += chunk
            apps.append(json.loads(chunks))
        wall = max(a["finished"] for a in apps) - started
    parent = {"pid": os.getpid(), "uss_mib": round(uss(os.getpid()) / 2**20, 1), "threads": threads_of(os.getpid()), "gguf": gguf_mapped(os.getpid())}
    host = None
    if host_pid is not None:
        host = {"pid": host_pid, "uss_mib": round(uss(host_pid) / 2**20, 1), "threads": threads_of(host_pid), "gguf": gguf_mapped(host_pid)}
    if children:
        os.close(release_w)
        for pid, _ in children:
            os.waitpid(pid, 0)
    processes = ([parent] if workers > 1 else []) + apps + ([host] if host else [])
    model_processes = [p for p in processes if p["gguf"]]
    evaluations = workers * answers
    scored = sum(s == "scored" for a in apps for s in a["statuses"])
    relevancy_tracer.shutdown(1.0)
    return {
        "layout": f"{workers}x {mode}", "evaluations": evaluations, "scored": scored, "wall_s": round(wall, 1), "evaluations_per_s": round(evaluations / wall, 4),
        "app_uss_mib": [a["uss_mib"] for a in apps], "parent_uss_mib": parent["uss_mib"] if workers > 1 else None, "host_uss_mib": host["uss_mib"] if host else None,
        "llama_contexts": len(model_processes), "model_threads_total": sum(p["threads"] for p in model_processes),
    }


def forked(args) -> dict:
    rows = []
    layouts = [("in-process", 1, args.workers * args.answers), ("in-process", args.workers, args.answers), ("host", args.workers, args.answers)]
    for mode, workers, answers in layouts:
        out = subprocess.run([sys.executable, "-m", "benchmarks.model_host", "forked-child", mode, str(workers), str(answers)], capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"{mode} x{workers} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    one = rows[0]["evaluations_per_s"]
    return {"benchmark": "forked", "cpus": os.cpu_count(), "layouts": rows, "evaluations_per_s_vs_1_process": {r["layout"]: round(r["evaluations_per_s"] / one, 2) for r in rows}}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "latency-child":
        print(json.dumps(latency_child(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "forked-child":
        print(json.dumps(forked_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--seconds", type=float, default=40.0)
    lat.add_argument("--period", type=float, default=0.05)
    lat.add_argument("--variants", default="off,in-process,host-nice,host,scripted-host", help=f"comma-separated, run in this order; of: {', '.join(VARIANTS)}")
    lat.add_argument("--rounds", type=int, default=1, help="run the variants this many times (ratios per round, against that round's off)")
    lat.add_argument("--pace", type=float, default=2.5, help="seconds per chat request of the paced-host variant's scripted model")
    lat.add_argument("--out")
    fork = sub.add_parser("forked")
    fork.add_argument("--workers", type=int, default=4)
    fork.add_argument("--answers", type=int, default=2)
    fork.add_argument("--out")
    args = parser.parse_args()
    result = latency(args) if args.command == "latency" else forked(args)
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
