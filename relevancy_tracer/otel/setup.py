"""Installing OpenTelemetry SDK providers when the app has none; shutting them down in bounded time.

An app that already set a TracerProvider / MeterProvider keeps it: the tracer uses the global
ones. Otherwise :func:`install_providers` creates SDK providers configured by the standard
environment variables:

* ``OTEL_SDK_DISABLED=true``: nothing is installed (spans and metrics are no-ops);
* ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``: the resource (``Resource.create``);
* ``OTEL_TRACES_EXPORTER`` (``otlp`` default, ``console``, ``none``) and
  ``OTEL_METRICS_EXPORTER`` (``otlp`` default, ``prometheus``, ``console``, ``none``);
* ``OTEL_EXPORTER_OTLP_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL``:
  ``http/protobuf`` (default, as the specification says) or ``grpc``;
* ``OTEL_EXPORTER_OTLP_ENDPOINT``, headers, timeouts, ...: read by the exporters themselves;
* ``OTEL_METRIC_EXPORT_INTERVAL``: read by the periodic reader;
* ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT`` (default localhost:9464) for ``prometheus``;
  the listener is closed when the provider shuts down (``relevancy_tracer.shutdown()``, the
  service's stop), first, before any exporter is flushed, so the port is free afterwards.

Start-up never fails because of the environment: an unknown exporter name, a missing extra
(``prometheus`` without ``relevancy-tracer[prometheus]``, ``grpc`` without its exporter), or a
Prometheus port already taken (another worker process of the same app) is logged once as a
warning naming the variable, and that exporter is left out; the app starts.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from opentelemetry import metrics, trace

from .._logging import mask_credentials
from .metrics import score_views

logger = logging.getLogger("relevancy_tracer")

TRACE_EXPORTERS = ("otlp", "console", "none")
LOG_EXPORTERS = ("otlp", "console", "none")
METRIC_EXPORTERS = ("otlp", "prometheus", "console", "none")


def sdk_disabled() -> bool:
    """True when ``OTEL_SDK_DISABLED`` is set to true."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def otlp_protocol(signal: str) -> str:
    """The OTLP protocol of ``signal`` (``TRACES``, ``METRICS``, ``LOGS``): the signal's
    ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    ``http/protobuf``; lowercase."""
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    return value.strip().lower()


def exporter_names(variable: str, known: tuple[str, ...], problems: list[str]) -> list[str]:
    """The exporter names in the comma-separated ``variable`` (default ``otlp``), lowercase; a
    name not in ``known`` is left out and described in ``problems``."""
    names = []
    for name in (n.strip().lower() for n in os.environ.get(variable, "otlp").split(",")):
        if not name:
            continue
        if name not in known:
            problems.append(f"{variable}={name!r} is not one of {', '.join(known)}; ignored")
            continue
        names.append(name)
    return names


def has_tracer_provider() -> bool:
    """True when the app (or anyone) has set a global TracerProvider."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def has_meter_provider() -> bool:
    """True when a global MeterProvider has been set."""
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    return not isinstance(metrics.get_meter_provider(), _ProxyMeterProvider)


def bounded(function: Callable[[], Any], timeout: float) -> bool:
    """Run ``function()`` in a daemon thread and wait at most ``timeout`` seconds.

    True when it returned in time (its exceptions are logged). False when it is still running
    (it goes on in the background; a daemon thread never blocks interpreter exit) or when no
    thread could be started.
    """
    done = threading.Event()

    def run() -> None:
        try:
            function()
        except Exception:
            logger.exception("relevancy-tracer: a provider flush or shutdown failed")
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="relevancy-tracer-flush", daemon=True).start()
    except RuntimeError:
        return False
    return done.wait(max(0.0, timeout))


@dataclass
class OwnedProviders:
    """Providers this library installed (flushed and shut down by ``relevancy_tracer.shutdown``).

    Attributes:
        tracer_provider, meter_provider: the SDK providers, or None.
        exporters: what was set up, for the start-up log line (e.g. ``traces: otlp http``).
    """

    tracer_provider: Optional[Any] = None
    meter_provider: Optional[Any] = None
    exporters: list[str] = field(default_factory=list)
    listeners: list[Callable[[], None]] = field(default_factory=list)  # close the Prometheus listener

    def force_flush(self, timeout_s: float) -> bool:
        """Flush both providers; True when both finished within ``timeout_s`` seconds in all."""
        ok = True
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                outcome: list[Any] = []
                ok = bounded(lambda p=provider: outcome.append(p.force_flush(int(max(0.0, timeout_s) * 1000))), timeout_s) and outcome[:1] != [False] and ok
        return ok

    def shutdown(self, timeout_s: float = 10.0) -> bool:
        """Flush and shut down both providers within ``timeout_s`` seconds in all (an exporter
        whose endpoint never answers is abandoned, not waited for). True when both finished."""
        providers = [p for p in (self.tracer_provider, self.meter_provider) if p is not None]
        listeners, self.listeners = self.listeners, []
        if not providers and not listeners:
            return True

        def run() -> None:
            close_listeners(listeners)
            for provider in providers:
                try:
                    provider.shutdown()
                except Exception:
                    logger.exception("relevancy-tracer: provider shutdown failed")

        return bounded(run, timeout_s)


def span_exporter(name: str) -> Any:
    """A span exporter for ``name`` (``console`` or ``otlp``, over :func:`otlp_protocol`)."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if otlp_protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPSpanExporter

    return HTTPSpanExporter()


def log_exporter(name: str) -> Any:
    """A log record exporter for ``name`` (``console`` or ``otlp``, over :func:`otlp_protocol`)."""
    if name == "console":
        from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter

        return ConsoleLogRecordExporter()
    if otlp_protocol("LOGS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter  # type: ignore[assignment]
    return OTLPLogExporter()


def metric_readers(problems: list[str]) -> list[tuple[str, Any]]:
    """(exporter name, metric reader) for each name in ``OTEL_METRICS_EXPORTER`` except
    ``none``; an exporter that cannot be created is skipped and described in ``problems``
    (never raised: start-up does not fail for the environment)."""
    out = []
    for name in exporter_names("OTEL_METRICS_EXPORTER", METRIC_EXPORTERS, problems):
        if name == "none":
            continue
        try:
            reader = _metric_reader(name, problems)
        except Exception as exc:
            problems.append(f"OTEL_METRICS_EXPORTER={name}: cannot create the exporter ({type(exc).__name__}: {exc}); metrics are not exported")
            reader = None
        if reader is not None:
            out.append((name, reader))
    return out


def _metric_reader(name: str, problems: list[str]) -> Optional[Any]:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    if name == "prometheus":
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
        except ImportError:
            problems.append("OTEL_METRICS_EXPORTER=prometheus needs pip install 'relevancy-tracer[prometheus]'; no Prometheus endpoint")
            return None
        host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        raw_port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")
        try:
            port = int(raw_port)
        except ValueError:
            problems.append(f"OTEL_EXPORTER_PROMETHEUS_PORT={raw_port!r} is not a port number; using 9464")
            port = 9464
        try:
            server, thread = start_http_server(port=port, addr=host)
        except OSError as exc:
            problems.append(f"OTEL_EXPORTER_PROMETHEUS_PORT={port}: cannot listen on {host}:{port} ({exc}); no Prometheus endpoint in this process")
            return None

        class ListeningPrometheusMetricReader(PrometheusMetricReader):
            """OpenTelemetry's Prometheus reader with the HTTP listener it is served on:
            :meth:`shutdown` (the MeterProvider's) also closes the listener."""

            def close_listener(self) -> None:
                """Stop serving and close the listening socket (idempotent)."""
                with lock:
                    if closed:
                        return
                    closed.append(True)
                server.shutdown()
                server.server_close()
                thread.join(5.0)

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
                self.close_listener()
                super().shutdown(timeout_millis=timeout_millis, **kwargs)

        lock, closed = threading.Lock(), []  # type: ignore[var-annotated]
        try:
            return ListeningPrometheusMetricReader()
        except Exception:
            server.shutdown()
            server.server_close()
            raise
    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if otlp_protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # type: ignore[assignment]
    return PeriodicExportingMetricReader(OTLPMetricExporter())


def close_listeners(listeners: list[Callable[[], None]]) -> None:
    """Call each ``close_listener`` (of :func:`metric_readers`' Prometheus readers); failures
    are logged."""
    for close in listeners:
        try:
            close()
        except Exception:
            logger.exception("relevancy-tracer: closing the Prometheus listener failed")


def listeners_of(readers: list[Any]) -> list[Callable[[], None]]:
    """The ``close_listener`` methods of the readers that serve an HTTP listener."""
    return [reader.close_listener for reader in readers if hasattr(reader, "close_listener")]


_warned: set[str] = set()


def warn_once(problem: str) -> None:
    """Log ``problem`` as a warning (credentials masked), once per process."""
    if problem not in _warned:
        _warned.add(problem)
        logger.warning("relevancy-tracer: %s", mask_credentials(problem))


def install_providers() -> OwnedProviders:
    """Install SDK Tracer/MeterProviders from the environment where none is set (see module
    doc). Never raises: a problem with one exporter is warned about once and that exporter is
    left out."""
    owned = OwnedProviders()
    if sdk_disabled():
        owned.exporters.append("OTEL_SDK_DISABLED=true: no providers")
        return owned
    problems: list[str] = []
    try:
        from opentelemetry.sdk.resources import Resource

        resource = Resource.create()
        if not has_tracer_provider():
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=resource)
            for name in exporter_names("OTEL_TRACES_EXPORTER", TRACE_EXPORTERS, problems):
                if name == "none":
                    continue
                try:
                    provider.add_span_processor(BatchSpanProcessor(span_exporter(name)))
                    owned.exporters.append(f"traces: {name}" + (f" {otlp_protocol('TRACES')}" if name == "otlp" else ""))
                except Exception as exc:  # e.g. the grpc exporter's package missing
                    problems.append(f"OTEL_TRACES_EXPORTER={name}: cannot create the exporter ({type(exc).__name__}: {exc}); spans are not exported")
            trace.set_tracer_provider(provider)
            owned.tracer_provider = provider
        else:
            owned.exporters.append("traces: the app's TracerProvider")
        if not has_meter_provider():
            from opentelemetry.sdk.metrics import MeterProvider

            readers = []
            for name, reader in metric_readers(problems):
                readers.append(reader)
                owned.exporters.append(f"metrics: {name}" + (f" {otlp_protocol('METRICS')}" if name == "otlp" else ""))
            meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=score_views())
            metrics.set_meter_provider(meter_provider)
            owned.meter_provider = meter_provider
            owned.listeners = listeners_of(readers)
        else:
            owned.exporters.append("metrics: the app's MeterProvider")
    except Exception as exc:  # never take the app down at start-up
        problems.append(f"OpenTelemetry setup failed ({type(exc).__name__}: {exc}); continuing without installed providers")
    for problem in problems:
        warn_once(problem)
    return owned


def service_name() -> str:
    """``service.name`` of the global TracerProvider's resource, else from the environment."""
    resource = getattr(trace.get_tracer_provider(), "resource", None)
    name = getattr(resource, "attributes", {}).get("service.name") if resource is not None else None
    if name:
        return str(name)
    from opentelemetry.sdk.resources import Resource

    return str(Resource.create().attributes.get("service.name", "unknown_service"))
