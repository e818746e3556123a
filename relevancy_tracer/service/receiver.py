"""The OTLP trace receiver of ``relevancy-tracer serve``: OTLP/HTTP (protobuf and JSON, gzip) on
``/v1/traces`` and OTLP/gRPC ``TraceService/Export``.

Each export request is decoded, its candidate spans selected (``selection.py``) and offered to
the queue as one unit. When the queue cannot take all of them the request is refused with
OTLP's retryable codes, so exporters and Collectors re-send it: HTTP 429 with ``Retry-After``
(seconds: the estimated time for the queue to drain enough, 1-30), gRPC ``UNAVAILABLE``. Every
refusal is counted (``relevancy.service.refused``). A malformed body is answered 400 /
``INVALID_ARGUMENT`` (not retryable: re-sending it would not help).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

from .otlp import OTLPDecodeError, parse_request, spans_of

logger = logging.getLogger("relevancy_tracer")

#: accept(request message) -> True (queued, or nothing to queue) | False (refused: queue full)
Accept = Callable[[Any], bool]


class DrainRate:
    """An exponentially weighted estimate of jobs finished per second, for ``Retry-After``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rate = 0.0
        self._last = time.monotonic()
        self._count = 0

    def done(self, n: int = 1) -> None:
        with self._lock:
            self._count += n
            now = time.monotonic()
            elapsed = now - self._last
            if elapsed >= 1.0:
                current = self._count / elapsed
                self._rate = current if self._rate == 0 else 0.7 * self._rate + 0.3 * current
                self._count, self._last = 0, now

    def retry_after(self, backlog: int) -> int:
        """Seconds to wait before re-sending (1-30), from the backlog and the drain rate."""
        with self._lock:
            rate = self._rate
        if rate <= 0:
            return 5
        return int(min(30, max(1, math.ceil(backlog / rate / 2))))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _reply(self, code: int, body: bytes, content_type: str, headers: Optional[dict] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") in ("/healthz", "/health", ""):
            self._reply(200, b'{"status":"ok"}', "application/json")
        else:
            self._reply(404, b"{}", "application/json")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        server: "OTLPServer" = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.startswith("/v1/traces"):
            self._reply(404, b"{}", "application/json")
            return
        content_type = self.headers.get("Content-Type", "application/x-protobuf")
        is_json = "json" in content_type.lower()
        if not is_json and "protobuf" not in content_type.lower():
            self._reply(415, b'{"message":"use application/x-protobuf or application/json"}', "application/json")
            return
        try:
            request = parse_request(body, content_type, self.headers.get("Content-Encoding", ""))
        except OTLPDecodeError as exc:
            self._reply(400, json_format.MessageToJson(_status(str(exc))).encode() if is_json else _status(str(exc)).SerializeToString(), content_type)
            return
        if not server.accept(request):
            server.count_refusal("http")
            seconds = server.retry_after()
            message = _status("the scoring queue is full; retry later")
            self._reply(429, json_format.MessageToJson(message).encode() if is_json else message.SerializeToString(), content_type, {"Retry-After": str(seconds)})
            return
        response = ExportTraceServiceResponse()
        self._reply(200, json_format.MessageToJson(response).encode() if is_json else response.SerializeToString(), content_type)


def _status(message: str) -> Any:
    from google.rpc import status_pb2

    return status_pb2.Status(code=8, message=message)  # RESOURCE_EXHAUSTED / INVALID_ARGUMENT detail


class OTLPServer:
    """OTLP/HTTP and OTLP/gRPC trace receivers calling ``accept`` for each export request.

    Args:
        accept: ``accept(ExportTraceServiceRequest) -> bool`` (False: refuse, retryable).
        host: bind address. http_port, grpc_port: ports (0: a free port; None: that protocol off).
        retry_after: ``retry_after() -> int`` seconds for refusals. on_refusal: ``fn(protocol)``.
    """

    def __init__(self, accept: Accept, *, host: str = "127.0.0.1", http_port: Optional[int] = 4318, grpc_port: Optional[int] = 4317, retry_after: Callable[[], int] = lambda: 5, on_refusal: Callable[[str], None] = lambda protocol: None):
        self.accept = accept
        self.host = host
        self.retry_after = retry_after
        self.count_refusal = on_refusal
        self._http: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._grpc: Any = None
        self.http_port: Optional[int] = None
        self.grpc_port: Optional[int] = None
        self._want_http, self._want_grpc = http_port, grpc_port

    def start(self) -> "OTLPServer":
        """Bind and serve. Raises OSError when a port is taken."""
        if self._want_http is not None:
            httpd = ThreadingHTTPServer((self.host, self._want_http), _Handler)
            httpd.daemon_threads = True
            httpd.owner = self  # type: ignore[attr-defined]
            self._http = httpd
            self.http_port = httpd.server_address[1]
            self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="relevancy-tracer-otlp-http", daemon=True)
            self._thread.start()
        if self._want_grpc is not None:
            self._start_grpc(self._want_grpc)
        return self

    def _start_grpc(self, port: int) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        owner = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
                if not owner.accept(request):
                    owner.count_refusal("grpc")
                    context.set_trailing_metadata((("retry-after", str(owner.retry_after())),))
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the scoring queue is full; retry later")
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="relevancy-tracer-otlp-grpc"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        bound = server.add_insecure_port(f"{self.host}:{port}")
        if bound == 0:
            raise OSError(f"cannot listen for OTLP/gRPC on {self.host}:{port}")
        server.start()
        self._grpc = server
        self.grpc_port = bound

    def stop(self, grace: float = 2.0) -> None:
        """Stop receiving (in-flight requests get ``grace`` seconds)."""
        if self._grpc is not None:
            self._grpc.stop(grace).wait(grace + 1)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def decode_spans(request: Any) -> list:
    """The spans of a request (re-exported for the service)."""
    return spans_of(request)
