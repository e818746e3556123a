"""The OTLP receiver of ``relevancy-tracer serve``: OTLP/HTTP (protobuf and JSON, gzip) on
``/v1/traces``, ``/v1/logs`` and ``/v1/metrics`` (aiohttp's server), OTLP/gRPC
``TraceService/Export``, ``LogsService/Export`` and ``MetricsService/Export`` (grpcio's asyncio
server), both on one event loop thread.

Each export request is decoded, its candidate spans selected (``selection.py``) and offered to
the queue as one unit (``accept``); a logs export request goes to ``accept_logs`` (GenAI
content events joined to their spans, ``join.py``) under the same limits, authentication and
refusals. A metrics export request (SDKs send their metrics to the same endpoint by default) is
read and counted under the same limits, then discarded (``on_metrics``): answered OK, so an
app's metrics exporter does not log an error every export interval. Answers, as the OTLP
specification lays them out:

* queued (or nothing to queue): HTTP 200 / gRPC OK, with ``partial_success`` counting the spans
  rejected for good (invalid trace or span ids) and why;
* the queue cannot take them now: HTTP 429 with ``Retry-After`` (seconds: the estimated time for
  the queue to drain enough, 1-30), gRPC ``UNAVAILABLE`` with a ``retry-after`` trailer; both
  retryable, so exporters and Collectors re-send; counted (``relevancy.service.refused``);
* not an OTLP trace export (bad protobuf, JSON that is not an object or nests too deeply, corrupt
  gzip): 400 / ``INVALID_ARGUMENT``; wrong Content-Type or Content-Encoding: 415;
* above ``max_request_bytes``, received or once decompressed, or a request whose decoding would
  take more memory than the whole decoding budget (``DECODE_BUDGET_FACTOR`` x
  ``max_request_bytes``, at least 64 MiB; e.g. millions of empty spans): 413 / ``RESOURCE_EXHAUSTED``;
* no room in the decoding budget within ``body_timeout`` (other requests being decoded): 503 /
  ``UNAVAILABLE`` with ``Retry-After: 1``;
* the receiver stopping while the request is being decoded: 503 / ``UNAVAILABLE`` with
  ``Retry-After: 1``;
* no or a wrong ``Authorization: Bearer <token>`` when a token is set: 401 /
  ``UNAUTHENTICATED`` (gRPC: from the call's metadata, before its message is read);
* a malformed HTTP request (bad ``Content-Length``, bad chunk framing, header lines too long):
  aiohttp's parser answers 400 with a message.

Every error body is a ``google.rpc.Status`` in the request's encoding (JSON for requests that
are neither protobuf nor JSON). Connections are bounded (:class:`ReceiverLimits`): at most
``max_connections`` HTTP connections (more get 503 at once), each closed when no complete request
head arrives within ``idle_timeout`` seconds (a half-open or trickling connection, or an idle
keep-alive); a body must arrive within ``body_timeout`` (408); at most ``max_inflight``
bodies are read and decoded at once (a request waiting longer than ``body_timeout`` for its turn
gets 503 with ``Retry-After``), so the buffers of requests in flight stay under about
``max_inflight * 2 * max_request_bytes`` (plus the decoded messages). A gRPC call holds no
thread while its message is on the way; it gets a decoding turn under the same
``max_inflight`` bound and then ``body_timeout`` for its message.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hmac
import logging
import math
import os
import ssl
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..config import MAX_INT32, Settings
from .otlp import WIRE_FACTOR, DecodeBudget, GzipInflater, OTLPDecodeError, RequestTooLarge, count_items, count_json_metrics, decoded_bytes, parse_request, upfront_bytes

logger = logging.getLogger("relevancy_tracer")

def _setting_default(name: str) -> Any:
    """The default of a :class:`~relevancy_tracer.config.Settings` field: the one place it is written."""
    return Settings.__dataclass_fields__[name].default


#: Seconds between two log lines about connections the process could not accept (out of file
#: descriptors): one line with the count per interval, never one per failed accept.
ACCEPT_ERROR_LOG_INTERVAL = 10.0

#: The decoding budget (:class:`~relevancy_tracer.service.otlp.DecodeBudget`) in units of
#: ``max_request_bytes``: the largest request of spans without attributes fits alone.
DECODE_BUDGET_FACTOR = 32
#: The smallest decoding budget, bytes (small ``max_request_bytes`` values).
MIN_DECODE_BUDGET = 64 * 1024 * 1024

#: Default bound of a request body and of its decompressed size (see ``max_request_bytes``).
DEFAULT_MAX_REQUEST_BYTES = _setting_default("max_request_bytes")

# google.rpc.Code values carried in error bodies (the gRPC status codes).
INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE, UNAUTHENTICATED = 3, 4, 5, 8, 13, 14, 16


@dataclass(frozen=True)
class Admission:
    """What the queue made of one export request.

    Attributes:
        accepted: False when the queue cannot take the request now (answered retryable).
        rejected_spans: spans (log records, for a logs request) rejected for good (OTLP
            ``partial_success.rejected_spans`` / ``rejected_log_records``).
        message: why they were rejected (``partial_success.error_message``).
    """

    accepted: bool
    rejected_spans: int = 0
    message: str = ""


#: accept(ExportTraceServiceRequest) -> Admission (accept_logs: ExportLogsServiceRequest)
Accept = Callable[[Any], Admission]

#: gRPC service of each signal.
GRPC_SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService", "logs": "opentelemetry.proto.collector.logs.v1.LogsService", "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService"}
#: OTLP/HTTP path of each signal.
HTTP_PATHS = {"traces": "/v1/traces", "logs": "/v1/logs", "metrics": "/v1/metrics"}


@dataclass(frozen=True)
class ReceiverLimits:
    """Bounds of the receiver (all > 0). Defaults: the settings ``max_request_bytes`` and
    ``receiver_*`` (``relevancy_tracer.config``), where they are documented.

    Attributes:
        max_request_bytes: largest body, and largest decompressed body, in bytes.
        max_connections: HTTP connections open at once; gRPC calls in progress at once.
        idle_timeout: seconds a connection may go without a complete request head (from its
            start or its previous response), then it is closed. gRPC: idle connections close
            after ``10 * idle_timeout``.
        body_timeout: seconds to receive one request body (HTTP 408 after) or one gRPC
            message once its call has a decoding turn (DEADLINE_EXCEEDED after).
        max_inflight: request bodies (HTTP) and messages (gRPC) read and decoded at once (one
            waiting longer than ``body_timeout`` for its turn gets 503 / UNAVAILABLE); the
            decoding threads.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_connections: int = _setting_default("receiver_max_connections")
    idle_timeout: float = _setting_default("receiver_idle_timeout")
    body_timeout: float = _setting_default("receiver_body_timeout")
    max_inflight: int = _setting_default("receiver_max_inflight")


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


def _status(code: int, message: str) -> Any:
    from google.rpc import status_pb2

    return status_pb2.Status(code=code, message=message)


def _encode(message: Any, is_json: bool) -> bytes:
    from google.protobuf import json_format

    return json_format.MessageToJson(message, indent=None).encode() if is_json else message.SerializeToString()


def _response(admission: Admission, signal: str = "traces") -> Any:
    if signal == "metrics":
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

        return ExportMetricsServiceResponse()
    if signal == "logs":
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsPartialSuccess, ExportLogsServiceResponse

        if admission.rejected_spans:
            return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(rejected_log_records=admission.rejected_spans, error_message=admission.message))
        return ExportLogsServiceResponse()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, ExportTraceServiceResponse

    if admission.rejected_spans:
        return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(rejected_spans=admission.rejected_spans, error_message=admission.message))
    return ExportTraceServiceResponse()


class _DaemonPool:
    """At most ``workers`` daemon threads running submitted calls, started as needed.

    Not :class:`concurrent.futures.ThreadPoolExecutor`, whose threads the interpreter joins at
    exit: a decoding still running when ``serve`` stops (a huge request, a Redis that does not
    answer) would hold the process past its shutdown bound. Its result is moot by then (the
    client was answered 503 / UNAVAILABLE, retryable)."""

    def __init__(self, workers: int, name: str):
        self._workers, self._name = workers, name
        self._calls: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the decoding pool is shut down")
            self._calls.put((future, fn, args))
            if self._calls.qsize() > self._idle and self._threads < self._workers:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._calls.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to the waiting request
                    future.set_exception(exc)
            del item, future, fn, args

    def shutdown(self) -> None:
        """No more calls; idle threads end, busy ones end after their call (they never hold the
        interpreter's exit)."""
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._calls.put(None)


#: What a request waiting for its decoding gets once the receiver stops.
_STOPPING = object()
#: What a request gets when the decoding budget had no room for it within ``body_timeout``.
_BUSY = object()


class _ClientErrorLog(logging.LoggerAdapter):
    """aiohttp's server log: a malformed HTTP request is the client's error, answered 400 and
    logged in one line at DEBUG (no traceback on stderr for each bad request)."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:  # type: ignore[override]
        self.debug(f"{msg} (%s)", *args, exc_info if isinstance(exc_info, BaseException) else "")


class _Busy(asyncio.Protocol):
    """A connection above ``max_connections``: answered 503 (retryable), then closed lingering.

    Closing a socket with unread bytes in its receive buffer makes the kernel send a TCP RST,
    which discards the 503 before a client that sends its whole body first (urllib3, the OTLP
    exporters) reads it: the client sees a reset, not a retryable answer. So, like aiohttp's own
    lingering close: the reply is written, the write side shut (FIN) where the transport can,
    and what the client still sends is read and dropped until it closes or ``linger`` seconds
    pass (at most ``max_bytes``); then the socket is closed. At most ``max_lingering`` such
    connections linger at once (more are closed at once), so a flood holds bounded sockets.
    """

    BODY = b'{"code":14,"message":"too many connections; retry later"}'
    REPLY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)

    def __init__(self, lingering: set, linger: float, max_bytes: int, max_lingering: int):
        self.lingering, self.linger, self.left, self.max_lingering = lingering, linger, max_bytes, max_lingering
        self.transport: Any = None
        self.timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.REPLY)
        if len(self.lingering) >= self.max_lingering:
            transport.close()
            return
        self.lingering.add(self)
        if transport.can_write_eof():
            transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(self.linger, transport.close)

    def data_received(self, data: bytes) -> None:
        self.left -= len(data)
        if self.left < 0:
            self.transport.close()

    def eof_received(self) -> bool:
        self.transport.close()
        return False

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.lingering.discard(self)
        if self.timer is not None:
            self.timer.cancel()


class OTLPServer:
    """OTLP/HTTP and OTLP/gRPC receivers calling ``accept`` for each trace export request and
    ``accept_logs`` for each logs export request.

    Args:
        accept: ``accept(ExportTraceServiceRequest) -> Admission``.
        accept_logs: ``accept_logs(ExportLogsServiceRequest) -> Admission``; None: no logs
            receiver (``/v1/logs`` answers 404, ``LogsService`` UNIMPLEMENTED).
        on_metrics: ``on_metrics(metrics)``, called with the number of metrics (OTLP
            ``Metric`` messages) of each metrics export request, which is then answered OK
            (an empty ``ExportMetricsServiceResponse``) and discarded; the request is read,
            authenticated and bounded as a trace export is (a bad body is answered 400 /
            INVALID_ARGUMENT). None: no metrics receiver (``/v1/metrics`` answers 404,
            ``MetricsService`` UNIMPLEMENTED).
        host: bind address. http_port, grpc_port: ports (0: a free port; None: that protocol off).
        retry_after: ``retry_after() -> int`` seconds for refusals. on_refusal: ``fn(protocol,
            reason)`` for each retryable refusal; protocol ``"http"`` or ``"grpc"``, reason
            ``"queue_full"`` (429 / UNAVAILABLE), ``"too_many_connections"`` (503 on connect),
            ``"too_many_requests"`` (503: no body slot within ``body_timeout``) or
            ``"decoding_budget"`` (503: no room in the decoding budget within ``body_timeout``);
            also ``"unauthenticated"`` for each request refused for its token (401 /
            UNAUTHENTICATED, not retryable).
        token: when set, every export request must carry ``Authorization: Bearer <token>``
            (HTTP header, gRPC metadata); ``/healthz`` stays open.
        tls_cert, tls_key: PEM files; both set: HTTPS and gRPC over TLS.
        limits: :class:`ReceiverLimits`.

    Raises:
        ValueError: only one of ``tls_cert`` / ``tls_key``.
        OSError: from :meth:`start` when a port is taken or the TLS files cannot be loaded.
    """

    def __init__(
        self,
        accept: Accept,
        *,
        accept_logs: Optional[Accept] = None,
        on_metrics: Optional[Callable[[int], None]] = None,
        host: str = "127.0.0.1",
        http_port: Optional[int] = 4318,
        grpc_port: Optional[int] = 4317,
        retry_after: Callable[[], int] = lambda: 5,
        on_refusal: Callable[[str, str], None] = lambda protocol, reason: None,
        token: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        limits: ReceiverLimits = ReceiverLimits(),
    ):
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and a key file")
        self.accept = accept
        self.accept_logs = accept_logs
        self.on_metrics = on_metrics
        self.host = host
        self.retry_after = retry_after
        self.count_refusal = on_refusal
        self.limits = limits
        self.tls = tls_cert is not None
        self._tls_files = (tls_cert, tls_key)
        self._token = token.encode() if token else None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._web: Any = None
        self._listener: Any = None
        self._slots: Optional[asyncio.Semaphore] = None
        self._pool: Optional[_DaemonPool] = None
        self._stopping: Optional[asyncio.Event] = None
        #: decoding memory of the requests in flight: 32 x max_request_bytes (512 MiB at the
        #: default), at least 64 MiB
        self._budget: Optional[DecodeBudget] = DecodeBudget(max(MIN_DECODE_BUDGET, DECODE_BUDGET_FACTOR * limits.max_request_bytes))
        self._grpc: Any = None
        self._accept_errors = 0
        self._accept_error_logged = -math.inf
        self._accept_errors_lock = threading.Lock()
        self.http_port: Optional[int] = None
        self.grpc_port: Optional[int] = None
        self._want_http, self._want_grpc = http_port, grpc_port

    # ---------------------------------------------------------------- shared

    @property
    def signals(self) -> tuple[str, ...]:
        """The signals received: ``traces``, then ``logs`` and ``metrics`` when handled."""
        return ("traces",) + (("logs",) if self.accept_logs is not None else ()) + (("metrics",) if self.on_metrics is not None else ())

    def authorized(self, header: Optional[str]) -> bool:
        """Whether an ``Authorization`` value carries the token (always, when none is set)."""
        if self._token is None:
            return True
        scheme, _, credentials = (header or "").strip().partition(" ")
        # a header's undecodable bytes arrive as lone surrogates (surrogateescape): compared as
        # the bytes sent, never an exception (they cannot match a printable ASCII token)
        sent = credentials.strip().encode("utf-8", "surrogateescape")
        return scheme.lower() == "bearer" and hmac.compare_digest(sent, self._token)

    def start(self) -> "OTLPServer":
        """Bind and serve. Raises OSError when a port is taken or the TLS files are bad."""
        try:
            context = self._ssl_context()  # checks the TLS files for both protocols
            if self._want_http is not None or self._want_grpc is not None:
                self._start_loop()
            if self._want_http is not None:
                self._run(self._listen(self._want_http, context))
            if self._want_grpc is not None:
                self._run(self._listen_grpc(self._want_grpc))
        except BaseException:
            self.stop(0.5)
            raise
        return self

    def _start_loop(self) -> None:
        """The event loop both receivers run on (one thread), and the decoding threads."""
        self._pool = _DaemonPool(self.limits.max_inflight, "relevancy-tracer-otlp-decode")
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(self._loop_error)
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="relevancy-tracer-otlp", daemon=True)
        self._thread.start()

        async def slots() -> None:
            self._slots = asyncio.Semaphore(self.limits.max_inflight)
            self._stopping = asyncio.Event()

        self._run(slots())

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The receivers' loop's exception handler. A failed ``accept()`` for want of file
        descriptors (``EMFILE``/``ENFILE``: the process is at its ``RLIMIT_NOFILE``; asyncio
        retries the accept after 1 s) is counted as a refusal (``out_of_file_descriptors``) and
        logged once per :data:`ACCEPT_ERROR_LOG_INTERVAL` with the count, not once per failed
        accept with a traceback; everything else goes to asyncio's default handler."""
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self.count_refusal("http", "out_of_file_descriptors")
            now = time.monotonic()
            with self._accept_errors_lock:
                self._accept_errors += 1
                if now - self._accept_error_logged < ACCEPT_ERROR_LOG_INTERVAL:
                    return
                count, self._accept_errors, self._accept_error_logged = self._accept_errors, 0, now
            logger.warning(
                "relevancy-tracer serve: %d connection(s) not accepted in the last %.0f s: %s (the process's file"
                " descriptor limit; lower receiver_max_connections or raise the limit)",
                count, ACCEPT_ERROR_LOG_INTERVAL, os.strerror(error.errno or 0),
            )
            return
        loop.default_exception_handler(context)

    def _run(self, coroutine: Any, timeout: float = 30.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self, grace: float = 2.0) -> None:
        """Stop receiving. Requests in flight get ``grace`` seconds to finish, then they are
        cancelled (their clients see the connection close); returns within about
        ``grace + 1`` seconds, leaving no task or thread of the receiver behind."""
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(grace), loop).result(grace + 1.0)
            except Exception:  # a timeout here leaves a daemon thread only
                logger.debug("relevancy-tracer: stopping the OTLP receivers", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(1.0)
            if not loop.is_running():
                loop.close()
        self._grpc = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    async def _shutdown(self, grace: float) -> None:
        """Close the listeners (gRPC refuses new calls); requests in flight get three quarters
        of ``grace`` to finish, then those still waiting for their decoding are answered 503 /
        UNAVAILABLE (retryable: the exporter re-sends to another replica) and the rest (bodies
        still arriving) are cancelled by ``grace``; every task has unwound when this returns,
        so none is left pending when the loop closes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if self._listener is not None:
            self._listener.close()
        stopping = []
        if self._grpc is not None:
            stopping.append(asyncio.ensure_future(self._grpc.stop(grace)))
        if self._web is not None:
            stopping.append(asyncio.ensure_future(self._web.shutdown(grace)))
        if stopping:
            _, pending = await asyncio.wait(stopping, timeout=0.75 * grace)
            if self._stopping is not None:
                self._stopping.set()
            if pending:
                await asyncio.wait(pending, timeout=max(0.1, deadline - loop.time()))
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=0.5)

    async def _finished(self, decoding: Future) -> Any:
        """The outcome of a decoding, or :data:`_STOPPING` when the receiver stops first."""
        assert self._stopping is not None
        if self._stopping.is_set():
            return _STOPPING
        waiting = asyncio.wrap_future(decoding)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((waiting, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if waiting.done():
            return waiting.result()
        waiting.cancel()
        return _STOPPING

    def _ssl_context(self) -> Optional[ssl.SSLContext]:
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        encrypted = []

        def password() -> bytes:  # called only for an encrypted (passphrase-protected) key
            encrypted.append(True)
            raise ValueError("encrypted key")

        cert, key = self._tls_files
        try:
            context.load_cert_chain(cert, key, password=password)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if encrypted:
                raise OSError(f"the TLS key {key} is encrypted (passphrase-protected); serve needs an unencrypted PEM key: decrypt it, e.g. `openssl pkey -in {key} -out plain.key`, and pass that file") from None
            raise OSError(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from exc
        return context

    # ---------------------------------------------------------------- OTLP/HTTP

    async def _listen(self, port: int, context: Optional[ssl.SSLContext]) -> None:
        from aiohttp import web

        limits = self.limits
        # keepalive_timeout is armed when a connection opens and after each response, and closes
        # the connection unless a complete request head arrived: the header and idle timeout.
        self._web = web.Server(self._handle, keepalive_timeout=limits.idle_timeout, auto_decompress=False, access_log=None, logger=_ClientErrorLog(logging.getLogger("relevancy_tracer.otlp_http"), {}), handler_cancellation=True, lingering_time=min(10.0, limits.body_timeout))

        loop = asyncio.get_running_loop()
        opening: dict[Any, float] = {}  # handlers made but not yet connected (accepts come in bursts)
        lingering: set = set()  # connections answered 503, draining what their client still sends
        linger = min(10.0, limits.body_timeout)

        def connection() -> asyncio.Protocol:
            now = loop.time()
            for handler in [h for h, made in opening.items() if h.transport is not None or now - made > limits.idle_timeout]:
                del opening[handler]  # connected (now in .connections), or its TLS handshake failed
            if len(self._web.connections) + len(opening) >= limits.max_connections:
                self.count_refusal("http", "too_many_connections")
                return _Busy(lingering, linger, limits.max_request_bytes, limits.max_connections)
            handler = self._web()
            opening[handler] = now
            return handler

        self._listener = await loop.create_server(connection, self.host, port, ssl=context, backlog=128, ssl_handshake_timeout=limits.idle_timeout if context else None)
        self.http_port = self._listener.sockets[0].getsockname()[1]

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        path = request.path.rstrip("/")
        declared = request.headers.get("Content-Type", "").lower()
        content_type = declared or "application/x-protobuf"  # OTLP/HTTP's default encoding
        is_json = "json" in content_type
        errors_json = "protobuf" not in declared  # error bodies readable unless protobuf was asked for

        def error(status: int, code: int, message: str, headers: Optional[dict] = None) -> Any:
            return web.Response(status=status, body=_encode(_status(code, message), errors_json), content_type="application/json" if errors_json else "application/x-protobuf", headers=headers)

        if request.method in ("GET", "HEAD") and path in ("/healthz", "/health", ""):
            return web.Response(body=b'{"status":"ok"}', content_type="application/json")
        signals = {HTTP_PATHS[signal]: signal for signal in self.signals}
        signal = signals.get(path)
        if signal is None:
            return error(404, NOT_FOUND, f"no such path {request.path!r}; OTLP export requests go to POST " + ", ".join(signals))
        if request.method != "POST":
            return error(405, INVALID_ARGUMENT, "use POST", {"Allow": "POST"})
        if not self.authorized(request.headers.get("Authorization")):
            self.count_refusal("http", "unauthenticated")
            return error(401, UNAUTHENTICATED, "missing or wrong bearer token (Authorization: Bearer <token>)", {"WWW-Authenticate": "Bearer"})
        if "json" not in content_type and "protobuf" not in content_type:
            return error(415, INVALID_ARGUMENT, "use Content-Type application/x-protobuf or application/json")
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            return error(415, INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
        limit = self.limits.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return error(413, RESOURCE_EXHAUSTED, f"the body ({request.content_length} bytes) exceeds max_request_bytes ({limit})")
        assert self._slots is not None and self._pool is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), self.limits.body_timeout)
        except asyncio.TimeoutError:
            self.count_refusal("http", "too_many_requests")
            return error(503, UNAVAILABLE, "too many requests in progress; retry later", {"Retry-After": "1"})
        decoding = None
        try:
            if request.headers.get("Expect", "").lower() == "100-continue":
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = await asyncio.wait_for(self._read_body(request, encoding == "gzip"), self.limits.body_timeout)
            except asyncio.TimeoutError:
                response = error(408, DEADLINE_EXCEEDED, f"the body did not arrive within {self.limits.body_timeout:g} s")
                response.force_close()
                return response
            except RequestTooLarge as exc:
                return error(413, RESOURCE_EXHAUSTED, f"{exc} (max_request_bytes)")
            except OTLPDecodeError as exc:
                return error(400, INVALID_ARGUMENT, str(exc))
            except web.HTTPException:
                raise
            except Exception as exc:  # aiohttp's payload errors: bad chunk framing, a short body
                response = error(400, INVALID_ARGUMENT, f"bad request body: {exc}")
                response.force_close()
                return response
            # the slot is freed when the decoding ends, even if this request is cancelled first
            decoding = self._pool.submit(self._decode_and_admit, body, content_type, signal)
            decoding.add_done_callback(self._release_slot)
            outcome = await self._finished(decoding)
        finally:
            if decoding is None:
                self._slots.release()
        if outcome is _STOPPING:
            response = error(503, UNAVAILABLE, "the receiver is shutting down; retry", {"Retry-After": "1"})
            response.force_close()
            return response
        if isinstance(outcome, Admission):
            if not outcome.accepted:
                self.count_refusal("http", "queue_full")
                return error(429, UNAVAILABLE, "the scoring queue is full; retry later", {"Retry-After": str(self.retry_after())})
            return web.Response(body=_encode(_response(outcome, signal), is_json), content_type="application/json" if is_json else "application/x-protobuf")
        if outcome is _BUSY:
            self.count_refusal("http", "decoding_budget")
            return error(503, UNAVAILABLE, "the receiver's decoding memory is taken by other requests; retry later", {"Retry-After": "1"})
        if isinstance(outcome, RequestTooLarge):
            return error(413, RESOURCE_EXHAUSTED, str(outcome))
        if isinstance(outcome, OTLPDecodeError):
            return error(400, INVALID_ARGUMENT, str(outcome))
        return error(500, INTERNAL, f"the request could not be processed: {type(outcome).__name__}")

    def _release_slot(self, _future: Any) -> None:
        loop = self._loop
        if loop is not None and self._slots is not None:
            try:
                loop.call_soon_threadsafe(self._slots.release)
            except RuntimeError:  # the loop closed meanwhile
                pass

    async def _read_body(self, request: Any, gzip: bool) -> bytes:
        """The body, inflated when gzip, each side bounded by ``max_request_bytes``."""
        limit = self.limits.max_request_bytes
        inflater = GzipInflater(limit) if gzip else None
        parts, received = [], 0
        while True:
            chunk = await request.content.readany()
            if not chunk:
                break
            received += len(chunk)
            if received > limit:
                raise RequestTooLarge(f"the body exceeds {limit} bytes")
            parts.append(inflater.feed(chunk) if inflater is not None else chunk)
        if inflater is not None:
            inflater.finish()
        return b"".join(parts)

    def _decode_and_admit(self, body: bytes, content_type: str, signal: str = "traces", protocol: str = "HTTP") -> Any:
        """Admission, or what stopped it: an exception (``OTLPDecodeError``, ``RequestTooLarge``,
        a bug's) or :data:`_BUSY`. Runs on the decoding threads, holding the request's memory
        estimate against the :class:`DecodeBudget` (first what counting its items or
        ``json.loads`` takes, then what decoding and selecting them takes) while it is decoded,
        selected and queued."""
        budget = self._budget
        assert budget is not None
        is_json = "json" in content_type.lower()
        held = 0
        try:
            if signal == "metrics":  # counted (the protobuf's outer levels or the JSON checked), then discarded
                upfront = upfront_bytes(body, is_json)
                if not budget.acquire(upfront, self.limits.body_timeout):
                    return _BUSY
                held = upfront
                assert self.on_metrics is not None
                self.on_metrics(count_json_metrics(body) if is_json else count_items(body))
                return Admission(True)
            upfront = upfront_bytes(body, is_json) + (WIRE_FACTOR * len(body) if is_json else 0)
            if not budget.acquire(upfront, self.limits.body_timeout):
                return _BUSY
            held = upfront
            request = None
            if is_json:  # loaded and parsed under the upfront estimate, then counted
                request = parse_request(body, content_type, signal=signal)
                items = sum(len(getattr(scope, "spans" if signal == "traces" else "log_records")) for resource in getattr(request, "resource_spans" if signal == "traces" else "resource_logs") for scope in getattr(resource, "scope_spans" if signal == "traces" else "scope_logs"))
            else:
                items = count_items(body)
            need = decoded_bytes(len(body), items)
            budget.release(held)
            held = 0
            if not budget.acquire(need, self.limits.body_timeout):
                return _BUSY
            held = need
            accept = self.accept_logs if signal == "logs" else self.accept
            assert accept is not None
            return accept(request if request is not None else parse_request(body, content_type, signal=signal))
        except (OTLPDecodeError, RequestTooLarge) as exc:
            return exc
        except Exception as exc:  # a bug, never a dropped connection: answered 500 and logged
            logger.warning("relevancy-tracer: an OTLP/%s export request failed", protocol, exc_info=True)
            return exc
        finally:
            if held:
                budget.release(held)

    # ---------------------------------------------------------------- OTLP/gRPC

    async def _listen_grpc(self, port: int) -> None:
        """OTLP/gRPC on grpcio's asyncio server, on the receivers' event loop.

        A call holds no thread while its message is on the way: the token is checked from the
        call's metadata before the message is read (:class:`_TokenCheck`, a server
        interceptor), and the message is read by the handler itself (``Export`` is served as a
        stream-unary method: the same bytes on the wire as a unary call) within
        ``body_timeout`` after it got one of the ``max_inflight`` decoding slots (a call
        waiting longer for its slot gets UNAVAILABLE with ``retry-after: 1``; one whose message
        does not arrive in time, DEADLINE_EXCEEDED). At most ``max_connections`` calls are in
        progress at once (grpcio answers RESOURCE_EXHAUSTED above), and at most ``max_connections``
        connections are open (grpc core closes one more at once, before any handshake); a
        connection that completes no handshake within ``idle_timeout`` is closed, an idle one
        after ``10 * idle_timeout``."""
        import grpc

        limits = self.limits
        handlers = [
            grpc.method_handlers_generic_handler(GRPC_SERVICES[signal], {"Export": grpc.stream_unary_rpc_method_handler(functools.partial(self._export, signal=signal), request_deserializer=None, response_serializer=lambda message: message.SerializeToString())})
            for signal in self.signals
        ]
        options = [
            ("grpc.max_receive_message_length", min(limits.max_request_bytes, MAX_INT32)),  # also bounds the decompressed size
            ("grpc.max_connection_idle_ms", min(int(limits.idle_timeout * 10_000), MAX_INT32)),
            ("grpc.max_concurrent_streams", 100),
            # connections, counted by grpc core before any handshake (raw TCP without an HTTP/2
            # preface too): above the cap a new one is closed at once, so a flood of idle
            # connections cannot take every file descriptor of the process
            ("grpc.max_allowed_incoming_connections", limits.max_connections),
            # a connection that completes no HTTP/2 (and TLS) handshake in idle_timeout is closed
            ("grpc.server_handshake_timeout_ms", min(int(limits.idle_timeout * 1000), MAX_INT32)),
        ]
        server = grpc.aio.server(handlers=handlers, interceptors=[_TokenCheck(self)], options=options, maximum_concurrent_rpcs=limits.max_connections)
        address = f"{self.host}:{port}"
        if self.tls:
            cert, key = (open(path, "rb").read() for path in self._tls_files)  # type: ignore[arg-type]
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        else:
            bound = server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot listen for OTLP/gRPC on {address}")
        await server.start()
        self._grpc = server
        self.grpc_port = bound

    async def _export(self, requests: Any, context: Any, signal: str = "traces") -> Any:
        """One OTLP/gRPC export call (authenticated by :class:`_TokenCheck`)."""
        import grpc

        assert self._slots is not None and self._pool is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), self.limits.body_timeout)
        except asyncio.TimeoutError:
            self.count_refusal("grpc", "too_many_requests")
            context.set_trailing_metadata((("retry-after", "1"),))
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "too many requests in progress; retry later")
        decoding = None
        try:
            try:
                raw = await asyncio.wait_for(context.read(), self.limits.body_timeout)
            except asyncio.TimeoutError:
                raw = None
            if raw is None:
                await _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, f"the request message did not arrive within {self.limits.body_timeout:g} s")
            if raw is grpc.aio.EOF:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "no request message")

            # the slot is freed when the decoding ends, even if this call is cancelled first
            decoding = self._pool.submit(self._decode_and_admit, raw, "application/x-protobuf", signal, "gRPC")
            decoding.add_done_callback(self._release_slot)
            outcome = await self._finished(decoding)
        finally:
            if decoding is None:
                self._slots.release()
        if outcome is _STOPPING:
            context.set_trailing_metadata((("retry-after", "1"),))
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "the receiver is shutting down; retry")
        if outcome is _BUSY:
            self.count_refusal("grpc", "decoding_budget")
            context.set_trailing_metadata((("retry-after", "1"),))
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "the receiver's decoding memory is taken by other requests; retry later")
        if isinstance(outcome, RequestTooLarge):
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(outcome))
        if isinstance(outcome, OTLPDecodeError):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(outcome))
        if not isinstance(outcome, Admission):
            await _abort(context, grpc.StatusCode.INTERNAL, f"the request could not be processed: {type(outcome).__name__}")
        if not outcome.accepted:
            self.count_refusal("grpc", "queue_full")
            context.set_trailing_metadata((("retry-after", str(self.retry_after())),))
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "the scoring queue is full; retry later")
        return _response(outcome, signal)


async def _abort(context: Any, code: Any, message: str) -> None:
    """End a gRPC call with ``code`` (raises grpc's AbortError, as ``context.abort`` does). A
    call grpcio already ended (cancelled by its client, or its message refused above
    ``grpc.max_receive_message_length``) has nothing left to answer: it unwinds quietly (as a
    cancellation) instead of grpcio logging a failed batch with a traceback."""
    import grpc

    try:
        await context.abort(code, message)
    except grpc.aio.AbortError:
        raise
    except Exception:
        raise asyncio.CancelledError() from None


def _token_check_class() -> Any:
    import grpc

    class TokenCheck(grpc.aio.ServerInterceptor):
        """Refuses a call without the bearer token from its metadata, before its message is
        read: an unauthenticated caller holds nothing (answered UNAUTHENTICATED at once)."""

        def __init__(self, server: "OTLPServer"):
            self._server = server

            async def refuse(_requests: Any, context: Any) -> None:
                await _abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (authorization: Bearer <token>)")

            # a stream-request handler: grpcio runs it without waiting for a message
            self._refuse = grpc.stream_unary_rpc_method_handler(refuse)

        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            metadata = {key: value for key, value in (details.invocation_metadata or ()) if isinstance(value, str)}
            if self._server.authorized(metadata.get("authorization")):
                return await continuation(details)
            self._server.count_refusal("grpc", "unauthenticated")
            return self._refuse

    return TokenCheck


def _TokenCheck(server: OTLPServer) -> Any:  # noqa: N802 - builds the interceptor (grpc imported lazily)
    """The bearer-token interceptor of ``server``'s gRPC receiver."""
    global _token_check
    if _token_check is None:
        _token_check = _token_check_class()
    return _token_check(server)


_token_check: Any = None
