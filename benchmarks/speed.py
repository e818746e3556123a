"""Seconds per evaluation of the default method with the embedded local models.

Scores the 10 WikiEval development questions' good and poor answers (20 evaluations) with
``Engine.evaluate`` at the default concurrency, after one warm-up evaluation (model loading is
not counted), and reports throughput (wall seconds / evaluations) and median latency. It imports
``relevancy_tracer`` from wherever Python finds it, so the previous default is measured in the
same run by pointing ``PYTHONPATH`` at its checkout. That side runs this file as a script:
``python -m`` would put the current checkout first on ``sys.path``, ahead of ``PYTHONPATH``.

    git worktree add /tmp/previous 8456b91
    PYTHONPATH=/tmp/previous python benchmarks/speed.py --label previous --out benchmarks/results/speed_previous.json
    python -m benchmarks.speed --label current --out benchmarks/results/speed_current.json

Set ``OMP_WAIT_POLICY=PASSIVE`` and run nothing else model-heavy meanwhile (llama.cpp slows
about tenfold when another busy process shares the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("RELEVANCY_TRACER_SHARED", Path(__file__).resolve().parents[1].parent / "shared")) / "data" / "wikieval_dev.jsonl"


def _commit(package_dir: Path) -> str:
    """The git commit the scored package was checked out at (names no machine's path)."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=package_dir, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return package_dir.name


def _cpu_model() -> str:
    """The CPU's model name and whether it reports AMX (Linux ``/proc/cpuinfo``)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return name + (" (AMX)" if "amx_int8" in info else " (no AMX)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="current")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import relevancy_tracer
    from relevancy_tracer.config import Settings
    from relevancy_tracer.scoring.engine import Engine

    rows = []
    for line in args.data.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        rows += [{"question": r["question"], "answer": r["answer"]}, {"question": r["question"], "answer": r["poor_answer"]}]
    settings = Settings.resolve(llm="local", embeddings="local")
    engine = Engine(settings)
    engine.score(rows[0]["question"], rows[0]["answer"])  # loads the models
    latencies: list[float] = []
    stats = getattr(engine.models.llm, "stats", None)  # llama.cpp token counters, when the model has them
    before = dict(vars(stats)) if stats is not None else None
    started = time.perf_counter()
    cpu_started = time.process_time()

    async def timed() -> list:
        import asyncio

        limit = asyncio.Semaphore(settings.concurrency)

        async def one(row: dict) -> object:
            async with limit:
                t0 = time.perf_counter()
                result = await engine.ascore(row["question"], row["answer"])
                latencies.append(time.perf_counter() - t0)
                return result

        return await asyncio.gather(*(one(r) for r in rows))

    import asyncio

    results = asyncio.run(timed())
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started  # all threads' CPU time: less sensitive than wall time to other processes on the cores
    good = [r.score for r in results[0::2] if r.score is not None]
    poor = [r.score for r in results[1::2] if r.score is not None]
    pairs = sum(1.0 if g > p else 0.5 if g == p else 0.0 for g, p in zip([r.score for r in results[0::2]], [r.score for r in results[1::2]]) if g is not None and p is not None)
    out = {
        "label": args.label,
        "code": _commit(Path(relevancy_tracer.__file__).parent),
        "method": settings.method,
        "concurrency": settings.concurrency,
        "evaluations": len(rows),
        "wall_seconds": round(wall, 2),
        "seconds_per_evaluation": round(wall / len(rows), 2),
        "median_latency_seconds": round(statistics.median(latencies), 2),
        "cpu_seconds_per_evaluation": round(cpu / len(rows), 2),
        "failures": sum(1 for r in results if r.score is None),
        "pairwise_accuracy": round(pairs / 10, 2),
        "mean_score_good": round(statistics.mean(good), 3) if good else None,
        "mean_score_poor": round(statistics.mean(poor), 3) if poor else None,
        "tokens_per_evaluation": (
            {k: round((v - before.get(k, 0)) / len(rows), 1) for k, v in vars(stats).items()} if stats is not None else None
        ),  # prompt = evaluated, cached = reused from the KV cache, generated
        "labels_good": [r.label for r in results[0::2]],
        "labels_poor": [r.label for r in results[1::2]],
        "local_repack": getattr(settings, "local_repack", None),  # absent from older checkouts
        "weights_repacked": getattr(engine.models.llm, "repacked", None),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "cpu": _cpu_model(), "load_average": os.getloadavg()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1), encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k not in ("labels_good", "labels_poor", "machine")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
