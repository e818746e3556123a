"""Decoding OTLP trace and logs export requests (protobuf, OTLP/JSON) into plain span and log
records.

OTLP/HTTP carries ``ExportTraceServiceRequest`` and ``ExportLogsServiceRequest`` as binary
protobuf (``application/x-protobuf``) or as OTLP/JSON (``application/json``), optionally
gzip-compressed. OTLP/JSON is protobuf's JSON
mapping with two differences the specification states: trace and span ids are hex strings (not
base64), and enums are integers. gRPC carries the protobuf message.

Hostile input is bounded here: a gzip body is inflated in a stream and stopped at the byte
bound (:class:`GzipInflater`, :class:`RequestTooLarge`); a JSON body that is not an object, nests
too deeply or has wrong types is an :class:`OTLPDecodeError`; attribute texts are cut to
``max_text_chars`` and nested values to :data:`MAX_VALUE_DEPTH` levels before anything parses
them (selection parses ``input.value`` as JSON).
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional


class OTLPDecodeError(ValueError):
    """The request body is not an OTLP trace export (HTTP 400, gRPC INVALID_ARGUMENT)."""


class RequestTooLarge(ValueError):
    """The body, or its decompressed size, exceeds ``max_request_bytes`` (HTTP 413, gRPC
    RESOURCE_EXHAUSTED)."""


#: Levels of nested array / kvlist attribute values kept; deeper ones become None.
MAX_VALUE_DEPTH = 16


class GzipInflater:
    """Inflates a gzip stream fed in pieces, never holding more than ``limit`` output bytes.

    Args:
        limit: most decompressed bytes (>= 1).

    ``feed(chunk) -> bytes`` returns the next decompressed bytes and raises
    :class:`RequestTooLarge` as soon as the output would pass ``limit`` (a 1 MiB "gzip bomb"
    inflating to 1 GiB costs at most ``limit`` bytes and stops early), :class:`OTLPDecodeError`
    for a corrupt stream; ``finish()`` raises :class:`OTLPDecodeError` for a truncated one.
    Concatenated gzip members (RFC 1952) are decoded one after another.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> bytes:
        out = []
        data = chunk
        try:
            while data:
                piece = self._inflater.decompress(data, self.limit - self.total + 1)
                self.total += len(piece)
                if self.total > self.limit:
                    raise RequestTooLarge(f"the decompressed body exceeds {self.limit} bytes")
                out.append(piece)
                if self._inflater.unconsumed_tail:  # output bound reached for this call: continue
                    data = self._inflater.unconsumed_tail
                elif self._inflater.eof and self._inflater.unused_data:  # next gzip member
                    data = self._inflater.unused_data
                    self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                else:
                    data = b""
        except zlib.error as exc:
            raise OTLPDecodeError(f"bad gzip body: {exc}") from exc
        return b"".join(out)

    def finish(self) -> None:
        if not self._inflater.eof:
            raise OTLPDecodeError("bad gzip body: the stream ends before its end marker")


def decode_body(body: bytes, content_encoding: str, limit: int) -> bytes:
    """``body`` without its content encoding (``gzip`` or none), at most ``limit`` bytes.

    Raises :class:`RequestTooLarge` (body or inflated size above ``limit``) or
    :class:`OTLPDecodeError` (corrupt gzip, unsupported encoding)."""
    encoding = content_encoding.strip().lower()
    if len(body) > limit:
        raise RequestTooLarge(f"the body exceeds {limit} bytes")
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise OTLPDecodeError(f"unsupported Content-Encoding {content_encoding!r} (use gzip or none)")
    inflater = GzipInflater(limit)
    out = inflater.feed(body)
    inflater.finish()
    return out


# --------------------------------------------------------------------------------------------
# Memory of decoding: estimated before it happens, held against a budget (DecodeBudget).

#: Bytes of memory a decoded request takes per byte of its protobuf encoding, at most: upb's
#: message for spans without attributes (measured: 16.8 MB of 559k such spans parse to 115 MB).
WIRE_FACTOR = 8
#: Bytes of memory per span or log record once decoded into Python records and selected
#: (``spans_of``: about 420 B for a span without attributes, plus the selection's indexes).
ITEM_BYTES = 600
#: Bytes of memory counting a protobuf request's items takes per byte of it, at most (measured:
#: 16.8 MB of 8.4M empty spans peak at 256 MB while counted).
COUNT_FACTOR = 17
#: Bytes of memory ``json.loads`` takes per JSON object (``{``) and per byte of the body.
JSON_OBJECT_BYTES, JSON_FACTOR = 300, 4

_RAW: dict[str, Any] = {}


def _raw_request_class() -> Any:
    """A protobuf message with the layout of OTLP's trace and logs export requests down to their
    items, each item kept as bytes (``resource_spans[].scope_spans[].spans[]``, alike for logs):
    counting items costs 16 bytes each, not a decoded message."""
    if "request" not in _RAW:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        file = descriptor_pb2.FileDescriptorProto(name="relevancy_tracer/raw_otlp.proto", package="relevancy_tracer.raw_otlp", syntax="proto3")
        scope = file.message_type.add(name="Scope")
        scope.field.add(name="items", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
        resource = file.message_type.add(name="Resource")
        resource.field.add(name="scopes", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, type_name=".relevancy_tracer.raw_otlp.Scope")
        request = file.message_type.add(name="Request")
        request.field.add(name="resources", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, type_name=".relevancy_tracer.raw_otlp.Resource")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file)
        _RAW["request"] = message_factory.GetMessageClass(pool.FindMessageTypeByName("relevancy_tracer.raw_otlp.Request"))
    return _RAW["request"]


def count_items(body: bytes) -> int:
    """Spans (log records, metrics) of a protobuf trace (logs, metrics) export request, counted
    without decoding them (the three requests nest their items alike: field 1, then 2, then 2). Raises :class:`OTLPDecodeError` for a body that is not protobuf."""
    from google.protobuf.message import DecodeError

    try:
        raw = _raw_request_class().FromString(body)
    except (DecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"bad OTLP protobuf body: {exc}") from exc
    return sum(len(scope.items) for resource in raw.resources for scope in resource.scopes)


def count_json_metrics(body: bytes) -> int:
    """Metrics (``resourceMetrics[].scopeMetrics[].metrics[]``) of an OTLP/JSON
    ``ExportMetricsServiceRequest``, counted from ``json.loads`` without building the message
    (``serve`` discards metrics). Raises :class:`OTLPDecodeError` for a body that is not a JSON
    object or nests too deeply for the parser."""
    try:
        data = json.loads(body)
    except RecursionError as exc:
        raise OTLPDecodeError("bad OTLP/JSON body: nested too deeply") from exc
    except ValueError as exc:
        raise OTLPDecodeError(f"bad OTLP/JSON body: {exc}") from exc
    if not isinstance(data, dict):
        raise OTLPDecodeError(f"bad OTLP/JSON body: an ExportMetricsServiceRequest is a JSON object, not {type(data).__name__}")
    count = 0
    for resource in _objects(data.get("resourceMetrics") or data.get("resource_metrics")):
        for scope in _objects(resource.get("scopeMetrics") or resource.get("scope_metrics")):
            metrics = scope.get("metrics")
            count += len(metrics) if isinstance(metrics, list) else 0
    return count


def decoded_bytes(body_bytes: int, items: int) -> int:
    """Estimated memory (bytes) of decoding and selecting a protobuf request of ``body_bytes``
    holding ``items`` spans or log records: ``WIRE_FACTOR`` per byte plus ``ITEM_BYTES`` per item."""
    return WIRE_FACTOR * body_bytes + ITEM_BYTES * items


def upfront_bytes(body: bytes, is_json: bool) -> int:
    """Memory (bytes) to hold before a body is looked at: counting a protobuf body's items
    (``COUNT_FACTOR`` per byte: a 16-byte view per 2-byte item, the array's growth, a copy), or
    ``json.loads`` of a JSON body (from its count of ``{``, a C-speed scan)."""
    if is_json:
        return JSON_FACTOR * len(body) + JSON_OBJECT_BYTES * body.count(b"{")
    return COUNT_FACTOR * len(body)


class DecodeBudget:
    """Bytes of decoding memory held at once by the requests being decoded (thread-safe).

    Each request holds an estimate of what its decoding takes (:func:`upfront_bytes`, then
    :func:`decoded_bytes` once its items are counted) while it is decoded, selected and queued;
    a request waits (up to a timeout) until the others leave room, so the decoded requests in
    memory stay under ``capacity`` however many arrive at once. A request needing more than
    ``capacity`` alone is refused for good (``RequestTooLarge``).

    Args:
        capacity: bytes (> 0).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.held = 0
        self._room = threading.Condition()

    def acquire(self, amount: int, timeout: float) -> bool:
        """Hold ``amount`` bytes, waiting up to ``timeout`` s; False when there was no room."""
        if amount > self.capacity:
            raise RequestTooLarge(f"decoding it would take about {amount >> 20} MiB, above the receiver's decoding budget of {self.capacity >> 20} MiB (32 x max_request_bytes)")
        with self._room:
            if not self._room.wait_for(lambda: self.held + amount <= self.capacity, timeout):
                return False
            self.held += amount
            return True

    def release(self, amount: int) -> None:
        with self._room:
            self.held -= amount
            self._room.notify_all()


#: Span events looked at per span: the last ones (an SDK keeps 128 by default); only events named
#: ``gen_ai.*`` (the GenAI conventions' content events) with attributes are kept, so a span of
#: a million tiny events costs a look at its last :data:`MAX_SPAN_EVENTS`.
MAX_SPAN_EVENTS = 128
#: Span events kept per request at most: each costs a few hundred bytes once decoded, more per
#: wire byte than the decoding budget's estimate (``WIRE_FACTOR``) allows for, so their number
#: is bounded apart (8,192 x ~500 B: ~4 MiB; an export batch of 512 spans of 16 content events).
MAX_REQUEST_EVENTS = 8192


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """A GenAI content event recorded on a span (``gen_ai.user.message``, ``gen_ai.choice``,
    ``gen_ai.client.inference.operation.details``, ...): its name, Unix nanoseconds and
    attributes (strings cut as the span's)."""

    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass
class ReceivedSpan:
    """One span of an export request.

    Attributes:
        trace_id, span_id, parent_span_id: lowercase hex (32 / 16 / 16 digits; parent empty for
            a root). name: span name. kind: OTLP span kind (int).
        attributes: span attributes as Python values (str, bool, int, float, lists, dicts).
        resource: the resource's attributes (``service.name``, ``openinference.project.name``).
        scope: instrumentation scope name. start_ns, end_ns: Unix nanoseconds.
        events: the span's GenAI content events (:class:`SpanEvent`, at most
            :data:`MAX_SPAN_EVENTS`, the last ones), in order.
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
    events: list[SpanEvent] = field(default_factory=list)

    @property
    def ids_valid(self) -> bool:
        """Trace id of 16 bytes and span id of 8, neither all zeros (OTLP's definition of a
        valid span context); a parent id empty or of 8 bytes."""
        return (
            len(self.trace_id) == 32
            and self.trace_id != "0" * 32
            and len(self.span_id) == 16
            and self.span_id != "0" * 16
            and len(self.parent_span_id) in (0, 16)
        )

    @property
    def service_name(self) -> str:
        return str(self.resource.get("service.name") or "unknown_service")

    @property
    def project(self) -> Optional[str]:
        """The Phoenix project (resource ``openinference.project.name``), if any."""
        value = self.resource.get("openinference.project.name")
        return str(value) if value else None


def any_value(value: Any, max_text_chars: Optional[int] = None, depth: int = 0) -> Any:
    """A protobuf ``AnyValue`` as a Python value; strings cut to ``max_text_chars`` (None: whole),
    values nested deeper than :data:`MAX_VALUE_DEPTH` as None."""
    kind = value.WhichOneof("value")
    if kind is None or depth > MAX_VALUE_DEPTH:
        return None
    if kind == "array_value":
        return [any_value(v, max_text_chars, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value, max_text_chars, depth + 1) for kv in value.kvlist_value.values}
    if kind == "string_value" and max_text_chars is not None:
        return value.string_value[:max_text_chars]
    return getattr(value, kind)


def attributes(items: Any, max_text_chars: Optional[int] = None) -> dict[str, Any]:
    """Protobuf ``KeyValue`` items as a dict (strings cut to ``max_text_chars``)."""
    return {kv.key: any_value(kv.value, max_text_chars) for kv in items}


def _items(request: Any, signal: str, max_text_chars: Optional[int]) -> Any:
    """(resource attributes, scope name, item) of every span (``signal="traces"``) or log
    record (``"logs"``) of an export request; the resource's attributes decoded once."""
    resources, scopes, items = ("resource_spans", "scope_spans", "spans") if signal == "traces" else ("resource_logs", "scope_logs", "log_records")
    for resource_items in getattr(request, resources):
        resource = attributes(resource_items.resource.attributes, max_text_chars)
        for scope_items in getattr(resource_items, scopes):
            for item in getattr(scope_items, items):
                yield resource, scope_items.scope.name, item


def spans_of(request: Any, max_text_chars: Optional[int] = None) -> list[ReceivedSpan]:
    """Every span of an ``ExportTraceServiceRequest`` message, string attribute values cut to
    ``max_text_chars`` characters (None: whole), with their GenAI content events
    (:func:`span_events`; at most :data:`MAX_REQUEST_EVENTS` in the request)."""
    room = [MAX_REQUEST_EVENTS]
    return [
        ReceivedSpan(
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            name=span.name,
            kind=int(span.kind),
            attributes=attributes(span.attributes, max_text_chars),
            resource=resource,
            scope=scope,
            start_ns=int(span.start_time_unix_nano),
            end_ns=int(span.end_time_unix_nano),
            events=span_events(span, max_text_chars, room) if len(span.events) and room[0] > 0 else [],
        )
        for resource, scope, span in _items(request, "traces", max_text_chars)
    ]


def span_events(span: Any, max_text_chars: Optional[int] = None, room: Optional[list[int]] = None) -> list[SpanEvent]:
    """The GenAI content events (named ``gen_ai.*``, with attributes) among a protobuf span's
    last :data:`MAX_SPAN_EVENTS` events, strings cut to ``max_text_chars``; at most ``room[0]``
    of them, which is decreased by their number."""
    left = room[0] if room is not None else MAX_SPAN_EVENTS
    out = []
    for event in span.events[-MAX_SPAN_EVENTS:]:
        if len(out) >= left:
            break
        if event.name.startswith("gen_ai.") and len(event.attributes):
            out.append(SpanEvent(event.name, int(event.time_unix_nano), attributes(event.attributes, max_text_chars)))
    if room is not None:
        room[0] -= len(out)
    return out


def _objects(value: Any) -> list:
    """The JSON objects of a list (anything else is left for the protobuf parser to reject)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _hex_ids_to_base64(data: dict) -> None:
    """OTLP/JSON hex ids -> protobuf JSON mapping's base64, in place (spans, their links, and
    log records)."""
    items = []
    for resource_spans in _objects(data.get("resourceSpans") or data.get("resource_spans")):
        for scope_spans in _objects(resource_spans.get("scopeSpans") or resource_spans.get("scope_spans")):
            for span in _objects(scope_spans.get("spans")):
                items += [span] + _objects(span.get("links"))
    for resource_logs in _objects(data.get("resourceLogs") or data.get("resource_logs")):
        for scope_logs in _objects(resource_logs.get("scopeLogs") or resource_logs.get("scope_logs")):
            items += _objects(scope_logs.get("logRecords") or scope_logs.get("log_records"))
    for item in items:
        for key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
            value = item.get(key)
            if isinstance(value, str) and value:
                try:
                    item[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError as exc:
                    raise OTLPDecodeError(f"{key} {value!r} is not hex") from exc


def request_class(signal: str = "traces") -> Any:
    """The protobuf class of an OTLP export request: ``ExportTraceServiceRequest`` for
    ``"traces"``, ``ExportLogsServiceRequest`` for ``"logs"`` (KeyError for others)."""
    if signal == "logs":
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

        return ExportLogsServiceRequest
    if signal == "traces":
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        return ExportTraceServiceRequest
    raise KeyError(signal)


def parse_request(body: bytes, content_type: str = "application/x-protobuf", content_encoding: str = "", max_bytes: Optional[int] = None, signal: str = "traces") -> Any:
    """An ``ExportTraceServiceRequest`` (``signal="traces"``) or ``ExportLogsServiceRequest``
    (``signal="logs"``) from an OTLP/HTTP body.

    Args:
        body: the body as received. content_type: JSON when it contains ``json``, else
            protobuf. content_encoding: ``gzip`` or none. max_bytes: bound of the body and of
            its decompressed size (None: no bound). signal: ``traces`` or ``logs``.

    Raises:
        OTLPDecodeError: not an OTLP export of that signal (also: JSON that is not an object
            or nests too deeply, corrupt gzip). RequestTooLarge: above ``max_bytes``.
    """
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    body = decode_body(body, content_encoding, max_bytes if max_bytes is not None else 1 << 62)
    request = request_class(signal)()
    if "json" in content_type.lower():
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise OTLPDecodeError(f"bad OTLP/JSON body: an {type(request).__name__} is a JSON object, not {type(data).__name__}")
            _hex_ids_to_base64(data)
            json_format.ParseDict(data, request, ignore_unknown_fields=True)
        except OTLPDecodeError:
            raise
        except RecursionError as exc:
            raise OTLPDecodeError("bad OTLP/JSON body: nested too deeply") from exc
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            raise OTLPDecodeError(f"bad OTLP/JSON body: {exc}") from exc
        return request
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError) as exc:
        raise OTLPDecodeError(f"bad OTLP protobuf body: {exc}") from exc
    return request


@dataclass
class ReceivedLog:
    """One log record of a logs export request.

    Attributes:
        trace_id, span_id: lowercase hex of the span the record belongs to (empty when none).
        event_name: the record's ``event_name``, else its ``event.name`` attribute (older SDKs),
            else empty. body: the body as a Python value (a GenAI event's is a dict).
        attributes: the record's attributes. resource: its resource's attributes.
        time_ns: Unix nanoseconds (``time_unix_nano``, else ``observed_time_unix_nano``).
    """

    trace_id: str
    span_id: str
    event_name: str
    body: Any
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict)
    time_ns: int = 0

    @property
    def ids_valid(self) -> bool:
        """A trace id of 16 bytes and a span id of 8, neither all zeros (a record of a span)."""
        return len(self.trace_id) == 32 and self.trace_id != "0" * 32 and len(self.span_id) == 16 and self.span_id != "0" * 16


def log_records_of(request: Any, max_text_chars: Optional[int] = None) -> list[ReceivedLog]:
    """Every log record of an ``ExportLogsServiceRequest`` message, strings cut to
    ``max_text_chars`` characters (None: whole)."""
    out = []
    for resource, _scope, record in _items(request, "logs", max_text_chars):
        attrs = attributes(record.attributes, max_text_chars)
        out.append(
            ReceivedLog(
                trace_id=record.trace_id.hex(),
                span_id=record.span_id.hex(),
                event_name=record.event_name or str(attrs.get("event.name") or ""),
                body=any_value(record.body, max_text_chars) if record.HasField("body") else None,
                attributes=attrs,
                resource=resource,
                time_ns=int(record.time_unix_nano or record.observed_time_unix_nano),
            )
        )
    return out
