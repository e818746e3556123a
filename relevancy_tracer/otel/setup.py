"""Installing OpenTelemetry SDK providers when the app has none.

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
* ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT`` (default localhost:9464) for ``prometheus``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from opentelemetry import metrics, trace

from .metrics import score_views

logger = logging.getLogger("relevancy_tracer")


def sdk_disabled() -> bool:
    """True when ``OTEL_SDK_DISABLED`` is set to true."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def _protocol(signal: str) -> str:
    value = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    return value.strip().lower()


def _exporter_names(variable: str) -> list[str]:
    return [name.strip().lower() for name in os.environ.get(variable, "otlp").split(",") if name.strip()]


def has_tracer_provider() -> bool:
    """True when the app (or anyone) has set a global TracerProvider."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def has_meter_provider() -> bool:
    """True when a global MeterProvider has been set."""
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    return not isinstance(metrics.get_meter_provider(), _ProxyMeterProvider)


@dataclass
class OwnedProviders:
    """Providers this library installed (flushed and shut down by ``relevancy_tracer.shutdown``)."""

    tracer_provider: Optional[Any] = None
    meter_provider: Optional[Any] = None

    def force_flush(self, timeout_s: float) -> bool:
        ok = True
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                try:
                    ok = bool(provider.force_flush(int(max(0.0, timeout_s) * 1000))) and ok
                except Exception:
                    logger.exception("relevancy-tracer: force_flush failed")
                    ok = False
        return ok

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                try:
                    provider.shutdown()
                except Exception:
                    logger.exception("relevancy-tracer: provider shutdown failed")


def _span_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if _protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPSpanExporter

    return HTTPSpanExporter()


def _metric_reader(name: str) -> Any:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    if name == "prometheus":
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
        except ImportError as exc:
            raise ImportError("OTEL_METRICS_EXPORTER=prometheus needs pip install 'relevancy-tracer[prometheus]'") from exc
        host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
        start_http_server(port=port, addr=host)
        return PrometheusMetricReader()
    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # type: ignore[assignment]
    return PeriodicExportingMetricReader(OTLPMetricExporter())


def install_providers() -> OwnedProviders:
    """Install SDK Tracer/MeterProviders from the environment where none is set (see module doc)."""
    owned = OwnedProviders()
    if sdk_disabled():
        return owned
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create()
    if not has_tracer_provider():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource)
        for name in _exporter_names("OTEL_TRACES_EXPORTER"):
            if name != "none":
                provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
        trace.set_tracer_provider(provider)
        owned.tracer_provider = provider
    if not has_meter_provider():
        from opentelemetry.sdk.metrics import MeterProvider

        readers = [_metric_reader(name) for name in _exporter_names("OTEL_METRICS_EXPORTER") if name != "none"]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, views=score_views())
        metrics.set_meter_provider(meter_provider)
        owned.meter_provider = meter_provider
    return owned


def service_name() -> str:
    """``service.name`` of the global TracerProvider's resource, else from the environment."""
    resource = getattr(trace.get_tracer_provider(), "resource", None)
    name = getattr(resource, "attributes", {}).get("service.name") if resource is not None else None
    if name:
        return str(name)
    from opentelemetry.sdk.resources import Resource

    return str(Resource.create().attributes.get("service.name", "unknown_service"))
