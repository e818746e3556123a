"""The service's commands as processes: ``relevancy-tracer serve``, ``worker`` and ``backfill``.

Each function sets up logging (credentials masked), runs its part of :mod:`relevancy_tracer.service`
until SIGTERM or SIGINT (what Docker, systemd and Kubernetes send), stops it cleanly, prints a
summary line and returns the process's exit status.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Optional

from ..config import Settings
from .._logging import mask_credentials, mask_credentials_in
from .._signals import StopSignals, stop_on_signals


def service_logging() -> None:
    """INFO logs to stderr with timestamps; URLs and tokens masked in every handler (the HTTP
    clients log request URLs at INFO)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        mask_credentials_in(handler)


def run_serve(
    settings: Settings,
    *,
    queue_url: Optional[str] = None,
    host: str = "127.0.0.1",
    http_port: Optional[int] = 4318,
    grpc_port: Optional[int] = 4317,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    allow_unauthenticated: bool = False,
    shutdown_timeout: float = 20.0,
) -> int:
    """Run a :class:`~relevancy_tracer.service.scoring_service.ScoringService` until SIGTERM or
    SIGINT, then stop it within ``shutdown_timeout`` seconds. Prints where it listens and, at
    the end, what it accepted, refused and skipped. Returns 0, or 1 when queued evaluations or
    exports did not finish in time. Raises what :class:`ScoringService` raises (ValueError,
    OSError)."""
    from .scoring_service import ScoringService

    service_logging()
    service = ScoringService(settings, queue_url=queue_url, host=host, http_port=http_port, grpc_port=grpc_port, tls_cert=tls_cert, tls_key=tls_key, allow_unauthenticated=allow_unauthenticated).start()
    scheme = "https" if tls_cert else "http"
    print(f"relevancy-tracer serve: OTLP/HTTP {scheme}://{host}:{service.server.http_port}/v1/traces and /v1/logs, OTLP/gRPC {host}:{service.server.grpc_port}, queue {mask_credentials(queue_url) if queue_url else 'in-process'}", flush=True)
    stopped = threading.Event()
    stop_on_signals(stopped.set)
    while not stopped.wait(0.5):
        pass
    ok = service.stop(timeout=shutdown_timeout)
    skipped = sum(service.skipped.values())
    expired = sum(service.join.expired.values())
    print(f"relevancy-tracer serve: stopped ({service.accepted} spans accepted, {service.refused} requests refused, {skipped} GenAI calls skipped, {expired} unjoined halves expired)", flush=True)
    return 0 if ok else 1


def run_worker(queue_url: str, settings: Settings, *, claim_idle: float = 30.0, max_jobs: Optional[int] = None) -> int:
    """Run a :class:`~relevancy_tracer.service.fleet_worker.FleetWorker` on ``queue_url`` until
    SIGTERM or SIGINT (or ``max_jobs`` jobs); prints its jobs by outcome at the end. Returns 0."""
    from .fleet_worker import FleetWorker

    service_logging()
    worker = FleetWorker(queue_url, settings, claim_idle=claim_idle)
    stop_on_signals(worker.stop)
    print(f"relevancy-tracer worker {worker.consumer}: consuming {mask_credentials(queue_url)} (max_deliveries {settings.max_deliveries}, dead letters to {worker.queue.dead_letter_stream})", flush=True)
    worker.run(max_jobs=max_jobs)
    print(f"relevancy-tracer worker {worker.consumer}: stopped ({worker.scored} scored, {worker.skipped} already done, {worker.reclaimed} reclaimed, {worker.failed} failed, {worker.retried} retried, {worker.dead_lettered} dead-lettered)", flush=True)
    return 0


def run_backfill(phoenix_url: str, project: str, settings: Settings, *, since: Optional[str] = None, state: Optional[str] = None) -> int:
    """Run a :class:`~relevancy_tracer.service.backfill.Backfill` of ``project`` and print its
    report as JSON. SIGINT or SIGTERM annotate what is finished and keep the cursor in
    ``state``. Returns 0, 1 when some spans failed, or 128 + the signal."""
    from .backfill import Backfill

    run = Backfill(phoenix_url, project, settings, since=since, state=Path(state) if state else None)
    with StopSignals() as signals:
        signals.on_stop(run.stop)
        report = run.run()
    print(json.dumps({"seen": report.seen, "already_annotated": report.already_annotated, "scored": report.scored, "failed": report.failed, **({"interrupted": True} if report.interrupted else {})}))
    if signals.signum is not None:
        return signals.exit_status
    return 0 if report.failed == 0 else 1
