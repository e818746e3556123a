"""Memory and shutdown of the FastAPI recipe under gunicorn (docs/deploying.md), for sizing pods.

Serves ``examples/web_service.py`` with gunicorn (``--workers`` uvicorn workers, ``--preload``) on
127.0.0.1, as ``tests/test_deploy.py`` does, with the embedded default (``--models local``) or an
OpenAI-compatible endpoint (``--models openai``: the repository's FakeOpenAIServer, answering at
once). Sends ``--requests`` questions two at a time, waits until every answer's result is exported
(an in-process OTLP/HTTP receiver; on the answer span, or past its hold on the linked
EVALUATOR span), then reads each process's memory with psutil
(``memory_full_info``: RSS; USS, the private memory the process frees when it exits; PSS, its
share of the pages it shares, so the PSS of all processes adds up to what they use together):
gunicorn's master, each worker, and the model host (with the local default it serves both the scorer and the
example's retrieval embedder; with an endpoint only the retrieval embedder). Then SIGTERM, as Kubernetes sends it, once with every evaluation finished
(``idle``) and, in a second server, right after the last reply (``pending``: the lifespan's
``relevancy_tracer.shutdown(timeout=20)`` scores what it can, then ends the rest with status
``shutdown``); the seconds to exit of each, and whether every worker finished its shutdown
before gunicorn's ``--graceful-timeout`` (default 30 s; after it gunicorn kills the worker, and
still exits 0).

    flock /tmp/relevancy-model.lock python -m benchmarks.deploy --models local --requests 6 --out benchmarks/results/deploy_local.json
    python -m benchmarks.deploy --models openai --out benchmarks/results/deploy_openai.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUESTIONS = ("What does the pass statement do?", "How does a for loop work?", "What is a list comprehension?", "What does the with statement do?")
MIB = 1 << 20


def mib(values: dict[str, int]) -> dict[str, float]:
    return {key: round(value / MIB, 1) for key, value in values.items()}


def final_outcomes(spans: list[dict], requests: int) -> list[str] | None:
    """Each answer's final status, sorted: the answer span's, or for one ``deferred`` (its hold
    ended first) its linked EVALUATOR span's; None until every answer and EVALUATOR span is in."""
    answers = [s for s in spans if s["name"] == "qa.ask"]
    evaluations = {s["attributes"].get("relevancy.evaluation.id"): s["attributes"].get("relevancy.status") for s in spans if s["name"] == "answer_relevancy"}
    if len(answers) < requests:
        return None
    outcomes = []
    for span in answers:
        status = span["attributes"].get("relevancy.status")
        if status == "deferred":
            status = evaluations.get(span["attributes"].get("relevancy.evaluation.id"))
            if status is None:
                return None
        outcomes.append(status)
    return sorted(outcomes)


def run(models: str, workers: int, requests: int, pending: bool, directory: Path, graceful_timeout: float) -> dict[str, Any]:
    """One gunicorn server: its processes' memory after ``requests`` scored answers (unless
    ``pending``), then the seconds from SIGTERM to its exit."""
    import psutil

    from relevancy_tracer_testing import FakeOpenAIServer, OTLPReceiver
    from relevancy_tracer.config import Settings
    from relevancy_tracer.models.local_llm import cache_dir
    from relevancy_tracer_testing.deploy import ServedApp, app_environment, host_info, memory

    with FakeOpenAIServer() as endpoint, OTLPReceiver(grpc=False) as receiver:
        settings = {"RELEVANCY_TRACER_LLM": "local", "RELEVANCY_TRACER_EMBEDDINGS": "local"} if models == "local" else {
            "RELEVANCY_TRACER_LLM": "openai", "RELEVANCY_TRACER_EMBEDDINGS": "openai", "RELEVANCY_TRACER_LLM_BASE_URL": endpoint.base_url,
            "RELEVANCY_TRACER_LLM_MODEL": "fake-chat", "RELEVANCY_TRACER_EMBEDDING_MODEL": "fake-embed", "RELEVANCY_TRACER_LLM_API_KEY": "none",
        }
        env = app_environment(
            **settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint, OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
            OTEL_BSP_SCHEDULE_DELAY="100", OMP_WAIT_POLICY="PASSIVE",
        )
        app = ServedApp("gunicorn", env, log=directory / f"gunicorn-{models}-{'pending' if pending else 'idle'}.log", workers=workers, graceful_timeout=graceful_timeout)
        started = time.monotonic()
        app.start(timeout=600)
        ready = time.monotonic() - started
        batch = [f"{QUESTIONS[i % len(QUESTIONS)]} ({i})" for i in range(requests)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(app.ask, batch))
        result: dict[str, Any] = {"requests": requests, "seconds_to_ready": round(ready, 1)}
        if not pending:
            spans = receiver.wait_for_spans(lambda spans: final_outcomes(spans, requests) is not None, timeout=1800)
            result["statuses"] = sorted(s["attributes"].get("relevancy.status") for s in spans if s["name"] == "qa.ask")
            result["outcomes"] = final_outcomes(spans, requests)
            running = app.processes()
            # the model host of the workers' settings (the example's retrieval embedder runs in
            # the same host as the scorer with the local default, in one of its own otherwise)
            spec = dict(llm="local", embeddings="local") if models == "local" else dict(llm="openai", embeddings="local", embedding_model="use-multilingual-v3")
            info = host_info(Settings.resolve(**spec), cache_dir())
            result["memory_mib"] = {
                "master": mib(memory(running["master"])),
                "workers": [mib(memory(w)) for w in running["workers"]],
                "host": mib(memory(psutil.Process(info["pid"]))),
            }
            result["host"] = {"serves": [info["llm"], info["embedder"]], "clients": info["clients"], "threads": info["threads"]}
        code, seconds = app.terminate(bound=graceful_timeout + 60)
        result.update(exit_status=code, seconds_sigterm_to_exit=round(seconds, 2))
        if pending:
            spans = receiver.wait_for_spans(lambda spans: sum(s["name"] == "qa.ask" for s in spans) >= requests, timeout=10)
            result["statuses"] = sorted(s["attributes"].get("relevancy.status") for s in spans if s["name"] == "qa.ask")
        output = app.output()
        result["traceback_in_output"] = "Traceback" in output
        # a worker gunicorn killed after --graceful-timeout never completes its shutdown (and
        # gunicorn logs nothing of it)
        result["workers_shut_down"] = output.count("Application shutdown complete")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", choices=("local", "openai"), default="local")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--graceful-timeout", type=float, default=30.0, help="gunicorn's (its default; the example shuts the tracer down within 20 s)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="deploy-bench-") as directory:
        idle = run(args.models, args.workers, args.requests, False, Path(directory), args.graceful_timeout)
        pending = run(args.models, args.workers, args.requests, True, Path(directory), args.graceful_timeout)
    report = {
        "command": "python -m benchmarks.deploy " + " ".join(argv if argv is not None else sys.argv[1:]),
        "models": args.models, "workers": args.workers, "python": platform.python_version(),
        "idle": idle, "pending": pending,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
