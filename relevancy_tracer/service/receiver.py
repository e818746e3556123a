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

This module's one job: :class:`OTLPServer`, the facade that runs both receivers, its lifecycle (the event
loop thread, start, stop) and its constructor's contract. OTLP/HTTP is in
:mod:`~relevancy_tracer.service.receiver_http`, OTLP/gRPC in
:mod:`~relevancy_tracer.service.receiver_grpc`, the admission step both share (decoding turns,
decoding, hand-off, the answer's outcome) in :mod:`~relevancy_tracer.service.receiver_admission`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import ssl
import threading
import time
from typing import Any, Callable, Optional

from .receiver_admission import DECODE_BUDGET_FACTOR, DEFAULT_MAX_REQUEST_BYTES, MIN_DECODE_BUDGET, Accept, Admission, DaemonPool, ReceiverLimits
from .receiver_grpc import GRPC_SERVICES, GRPCReceiver
from .receiver_http import HTTP_PATHS, HTTPReceiver

__all__ = [
    "ACCEPT_ERROR_LOG_INTERVAL", "DECODE_BUDGET_FACTOR", "DEFAULT_MAX_REQUEST_BYTES", "GRPC_SERVICES", "HTTP_PATHS", "MIN_DECODE_BUDGET",
    "Accept", "Admission", "DrainRate", "OTLPServer", "ReceiverLimits",
]

logger = logging.getLogger("relevancy_tracer")

#: Seconds between two log lines about connections the process could not accept (out of file
#: descriptors): one line with the count per interval, never one per failed accept.
ACCEPT_ERROR_LOG_INTERVAL = 10.0


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


class OTLPServer(HTTPReceiver, GRPCReceiver):
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
        super().__init__(accept, accept_logs, on_metrics, retry_after, on_refusal, token, limits)
        self.host = host
        self.tls = tls_cert is not None
        self._tls_files = (tls_cert, tls_key)
        self._thread: Optional[threading.Thread] = None
        self._web = None
        self._listener = None
        self._grpc = None
        self._accept_errors = 0
        self._accept_error_logged = -math.inf
        self._accept_errors_lock = threading.Lock()
        self.http_port = None
        self.grpc_port = None
        self._want_http, self._want_grpc = http_port, grpc_port

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
        self._pool = DaemonPool(self.limits.max_inflight, "relevancy-tracer-otlp-decode")
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
