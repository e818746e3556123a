"""The service's own OpenTelemetry providers: evaluator spans per app project, log records, metrics.

Configured by the standard variables, as the decorator's (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``..._PROTOCOL``, ``OTEL_TRACES_EXPORTER``, ``OTEL_LOGS_EXPORTER``, ``OTEL_METRICS_EXPORTER``,
``OTEL_SERVICE_NAME`` default ``relevancy-tracer``).

Phoenix files spans into projects by the resource attribute ``openinference.project.name``, so an
evaluator span lands next to the span it scores only if it is exported under the scored app's
project: the service keeps one TracerProvider per project it has seen (at most
``max_projects``, least recently used closed first), each with its own batch processor.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Optional

from .._version import __version__
from ..otel.metrics import RelevancyMetrics, score_views
from ..otel.setup import LOG_EXPORTERS, TRACE_EXPORTERS, bounded, close_listeners, exporter_names, listeners_of, log_exporter, metric_readers, span_exporter, warn_once

logger = logging.getLogger("relevancy_tracer")

class ServiceTelemetry:
    """Tracer providers per project, a logger provider and a meter provider, from the environment.

    Args:
        max_projects: tracer providers kept at once. queue_depth: callable giving the queue depth
            (for the ``relevancy.queue.depth`` gauge).
    """

    def __init__(self, max_projects: int = 16, queue_depth: Any = None):
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        os.environ.setdefault("OTEL_SERVICE_NAME", "relevancy-tracer")
        self.resource = Resource.create()
        problems: list[str] = []
        self._trace_exporters = [n for n in exporter_names("OTEL_TRACES_EXPORTER", TRACE_EXPORTERS, problems) if n != "none"]
        self.logger_provider = LoggerProvider(resource=self.resource)
        for name in exporter_names("OTEL_LOGS_EXPORTER", LOG_EXPORTERS, problems):
            if name != "none":
                try:
                    self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter(name)))
                except Exception as exc:
                    problems.append(f"OTEL_LOGS_EXPORTER={name}: cannot create the exporter ({exc})")
        readers = [reader for _, reader in metric_readers(problems)]
        self._listeners = listeners_of(readers)  # the Prometheus listener, closed by shutdown()
        self.meter_provider = MeterProvider(resource=self.resource, metric_readers=readers, views=score_views())
        for problem in problems:
            warn_once(problem)
        self.logger = self.logger_provider.get_logger("relevancy_tracer")
        self.metrics = RelevancyMetrics(str(self.resource.attributes.get("service.name", "relevancy-tracer")), queue_depth or (lambda: 0), meter_provider=self.meter_provider)
        meter = self.meter_provider.get_meter("relevancy_tracer")
        self.refused = meter.create_counter("relevancy.service.refused", unit="{request}", description="OTLP export requests and connections refused with a retryable code, by error.type: queue_full (429 / UNAVAILABLE), too_many_connections (503 on connect), too_many_requests (503: no body slot in time); also unauthenticated (401 / UNAUTHENTICATED, not retryable)")
        self.reclaimed = meter.create_counter("relevancy.service.reclaimed", unit="{evaluation}", description="Pending jobs reclaimed from the Redis Stream (their worker died, or released them after a transient failure)")
        self.retried = meter.create_counter("relevancy.service.retried", unit="{evaluation}", description="Jobs left pending for redelivery with backoff after a transient failure, by error.type")
        self.dropped_results = meter.create_counter("relevancy.service.dropped_results", unit="{evaluation}", description="Results a fleet worker scored and did not write, as the job was no longer its own, by error.type: job_lost (another worker reclaimed it: this one was paused past --claim-idle), job_done (another worker finished it), job_deleted (deleted from the stream while held)")
        self.lost_jobs = meter.create_counter("relevancy.service.lost_jobs", unit="{evaluation}", description="Pending jobs deleted from the Redis Stream (XDEL, XTRIM by an operator or another client) before a worker finished them, counted by the worker that cleared their pending entry, by error.type: job_deleted")
        self.dead_lettered = meter.create_counter("relevancy.service.dead_lettered", unit="{evaluation}", description="Jobs moved to the dead-letter stream (malformed, or failed on their max_deliveries-th delivery), by error.type")
        self.max_projects = max_projects
        self._providers: "OrderedDict[Optional[str], Any]" = OrderedDict()
        self._lock = threading.Lock()

    def tracer(self, project: Optional[str]) -> Any:
        """The tracer exporting under ``project`` (Phoenix's ``openinference.project.name``)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor


        with self._lock:
            provider = self._providers.get(project)
            if provider is None:
                resource = self.resource.merge(Resource({"openinference.project.name": project})) if project else self.resource
                provider = TracerProvider(resource=resource)
                for name in self._trace_exporters:
                    provider.add_span_processor(BatchSpanProcessor(span_exporter(name)))
                self._providers[project] = provider
                while len(self._providers) > self.max_projects:
                    _, old = self._providers.popitem(last=False)
                    bounded(old.shutdown, 5.0)
            else:
                self._providers.move_to_end(project)
        return provider.get_tracer("relevancy_tracer", __version__)

    def force_flush(self, timeout: float = 10.0) -> bool:
        """Export everything written so far (spans and log records); True when done in time."""
        deadline = time.monotonic() + timeout
        with self._lock:
            providers = list(self._providers.values())
        ok = True
        for provider in providers + [self.logger_provider]:
            remaining = max(0.0, deadline - time.monotonic())
            outcome: list = []
            ok = bounded(lambda p=provider: outcome.append(p.force_flush(int(remaining * 1000))), remaining) and outcome[:1] != [False] and ok
        return ok

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Close the Prometheus listener (first: the port is free whatever the exporters do),
        export what is left and shut every provider down, within ``timeout`` seconds in all;
        True when everything finished in time."""
        deadline = time.monotonic() + timeout
        listeners, self._listeners = self._listeners, []
        close_listeners(listeners)
        ok = self.force_flush(max(0.0, deadline - time.monotonic()))
        with self._lock:
            providers = list(self._providers.values())
            self._providers.clear()

        def stop() -> None:
            for provider in providers + [self.logger_provider, self.meter_provider]:
                try:
                    provider.shutdown()
                except Exception:
                    logger.exception("relevancy-tracer: provider shutdown failed")

        return bounded(stop, max(0.0, deadline - time.monotonic())) and ok
