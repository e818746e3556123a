"""Decoding OTLP trace export requests (protobuf, OTLP/JSON) into plain span records.

OTLP/HTTP carries ``ExportTraceServiceRequest`` as binary protobuf (``application/x-protobuf``)
or as OTLP/JSON (``application/json``), optionally gzip-compressed. OTLP/JSON is protobuf's JSON
mapping with two differences the specification states: trace and span ids are hex strings (not
base64), and enums are integers. gRPC carries the protobuf message.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass, field
from typing import Any, Optional


class OTLPDecodeError(ValueError):
    """The request body is not an OTLP trace export (HTTP 400, gRPC INVALID_ARGUMENT)."""


@dataclass
class ReceivedSpan:
    """One span of an export request.

    Attributes:
        trace_id, span_id, parent_span_id: lowercase hex (32 / 16 / 16 digits; parent empty for
            a root). name: span name. kind: OTLP span kind (int).
        attributes: span attributes as Python values (str, bool, int, float, lists, dicts).
        resource: the resource's attributes (``service.name``, ``openinference.project.name``).
        scope: instrumentation scope name. start_ns, end_ns: Unix nanoseconds.
    """

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    start_ns: int = 0
    end_ns: int = 0

    @property
    def service_name(self) -> str:
        return str(self.resource.get("service.name") or "unknown_service")

    @property
    def project(self) -> Optional[str]:
        """The Phoenix project (resource ``openinference.project.name``), if any."""
        value = self.resource.get("openinference.project.name")
        return str(value) if value else None


def any_value(value: Any) -> Any:
    """A protobuf ``AnyValue`` as a Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def attributes(items: Any) -> dict[str, Any]:
    """Protobuf ``KeyValue`` items as a dict."""
    return {kv.key: any_value(kv.value) for kv in items}


def spans_of(request: Any) -> list[ReceivedSpan]:
    """Every span of an ``ExportTraceServiceRequest`` message."""
    out = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=int(span.kind),
                        attributes=attributes(span.attributes),
                        resource=resource,
                        scope=scope,
                        start_ns=int(span.start_time_unix_nano),
                        end_ns=int(span.end_time_unix_nano),
                    )
                )
    return out


def _hex_ids_to_base64(data: Any) -> None:
    """OTLP/JSON hex ids -> protobuf JSON mapping's base64, in place."""
    for resource_spans in data.get("resourceSpans") or data.get("resource_spans") or []:
        for scope_spans in resource_spans.get("scopeSpans") or resource_spans.get("scope_spans") or []:
            for span in scope_spans.get("spans") or []:
                items = [span] + list(span.get("links") or [])
                for item in items:
                    for key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
                        value = item.get(key)
                        if isinstance(value, str) and value:
                            try:
                                item[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                            except ValueError as exc:
                                raise OTLPDecodeError(f"{key} {value!r} is not hex") from exc


def parse_request(body: bytes, content_type: str = "application/x-protobuf", content_encoding: str = "") -> Any:
    """An ``ExportTraceServiceRequest`` from an OTLP/HTTP body. Raises OTLPDecodeError."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    if content_encoding.strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except OSError as exc:
            raise OTLPDecodeError(f"bad gzip body: {exc}") from exc
    request = ExportTraceServiceRequest()
    if "json" in content_type.lower():
        try:
            data = json.loads(body)
            _hex_ids_to_base64(data)
            json_format.ParseDict(data, request, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError) as exc:
            raise OTLPDecodeError(f"bad OTLP/JSON body: {exc}") from exc
        return request
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise OTLPDecodeError(f"bad OTLP protobuf body: {exc}") from exc
    return request
