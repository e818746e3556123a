"""The one admission step of the OTLP receivers (:mod:`~relevancy_tracer.service.receiver`):
what OTLP/HTTP and OTLP/gRPC share once a request is authenticated and within its protocol's
size limits. A request waits at most ``body_timeout`` for one of the ``max_inflight`` decoding
turns, its protocol reads its body within its turn, the body is decoded and handed to
``accept`` / ``accept_logs`` (``on_metrics`` for metrics) on a decoding thread, holding its
memory estimate against the decoding budget, and what came of it is one :class:`Admission` or
one :class:`Refusal` (already counted), which each protocol puts in its own words.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Union

from ..config import Settings
from .otlp import WIRE_FACTOR, DecodeBudget, OTLPDecodeError, RequestTooLarge, count_items, count_json_metrics, decoded_bytes, parse_request, upfront_bytes

logger = logging.getLogger("relevancy_tracer")

def _setting_default(name: str) -> Any:
    """The default of a :class:`~relevancy_tracer.config.Settings` field: the one place it is written."""
    return Settings.__dataclass_fields__[name].default


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


@dataclass(frozen=True)
class Refusal:
    """An export request answered with an error, in both protocols' terms.

    Attributes:
        status: the HTTP status (OTLP/HTTP).
        code: the ``google.rpc.Code`` (the gRPC status; also in the HTTP error body).
        message: the answer's message.
        retry_after: seconds for ``Retry-After`` (HTTP) / the ``retry-after`` trailer (gRPC),
            for a retryable refusal; None: not retryable, no such header.
        close: HTTP: close the connection after the answer.
    """

    status: int
    code: int
    message: str
    retry_after: Optional[str] = None
    close: bool = False


#: How each protocol is named in the log ("an OTLP/%s export request failed").
_WIRE_NAMES = {"http": "HTTP", "grpc": "gRPC"}


def export_response(admission: Admission, signal: str = "traces") -> Any:
    """The OTLP export response to an accepted request of ``signal`` (``"traces"``, ``"logs"``
    or ``"metrics"``): ``partial_success`` counting the spans (log records) of ``admission``
    rejected for good, if any; always empty for metrics."""
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


class DaemonPool:
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
        """Run ``fn(*args)`` on a pool thread (one more is started while fewer than ``workers``
        run and none is idle); its result or exception goes to the returned future. Raises
        ``RuntimeError`` once the pool is shut down."""
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


class AdmissionStep:
    """The state and the admission step that the OTLP/HTTP and OTLP/gRPC receivers share: the
    handlers, the limits, the token, the decoding turns (``max_inflight`` slots on the
    receivers' event loop), the decoding threads and the decoding budget. The receivers'
    facade (:class:`~relevancy_tracer.service.receiver.OTLPServer`) documents the arguments;
    its :meth:`~relevancy_tracer.service.receiver.OTLPServer.start` makes the loop, the slots
    and the threads."""

    def __init__(
        self,
        accept: Accept,
        accept_logs: Optional[Accept],
        on_metrics: Optional[Callable[[int], None]],
        retry_after: Callable[[], int],
        on_refusal: Callable[[str, str], None],
        token: Optional[str],
        limits: ReceiverLimits,
    ):
        self.accept = accept
        self.accept_logs = accept_logs
        self.on_metrics = on_metrics
        self.retry_after = retry_after
        self.count_refusal = on_refusal
        self.limits = limits
        self._token = token.encode() if token else None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._slots: Optional[asyncio.Semaphore] = None
        self._pool: Optional[DaemonPool] = None
        self._stopping: Optional[asyncio.Event] = None
        #: decoding memory of the requests in flight: 32 x max_request_bytes (512 MiB at the
        #: default), at least 64 MiB
        self._budget: Optional[DecodeBudget] = DecodeBudget(max(MIN_DECODE_BUDGET, DECODE_BUDGET_FACTOR * limits.max_request_bytes))

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

    async def _admit(self, protocol: str, signal: str, content_type: str, read: Callable[[], Awaitable[Union[bytes, Refusal]]]) -> Union[Admission, Refusal]:
        """The admission step of one export request, once its protocol has authenticated it and
        checked its size up front: a decoding turn (refused 503 / UNAVAILABLE, retryable, when
        none frees within ``body_timeout``), its body (``read``, the protocol's, within the
        turn: the body or the protocol's refusal), then its decoding and hand-off on a decoding
        thread (:meth:`_decode_and_admit`) and what came of it (:meth:`_verdict`).

        Args:
            protocol: ``"http"`` or ``"grpc"``, for the refusals counted.
            signal: ``"traces"``, ``"logs"`` or ``"metrics"``.
            content_type: the body's (``application/x-protobuf`` or a JSON type).
            read: ``read() -> bytes | Refusal``, awaited once the request has its turn.

        Returns:
            The queue's :class:`Admission` when accepted; otherwise the :class:`Refusal` to
            answer, its retryable refusal already counted (``on_refusal``).
        """
        assert self._slots is not None and self._pool is not None
        try:
            await asyncio.wait_for(self._slots.acquire(), self.limits.body_timeout)
        except asyncio.TimeoutError:
            self.count_refusal(protocol, "too_many_requests")
            return Refusal(503, UNAVAILABLE, "too many requests in progress; retry later", retry_after="1")
        decoding = None
        try:
            body = await read()
            if isinstance(body, Refusal):
                return body
            # the slot is freed when the decoding ends, even if this request is cancelled first
            decoding = self._pool.submit(self._decode_and_admit, body, content_type, signal, protocol)
            decoding.add_done_callback(self._release_slot)
            outcome = await self._finished(decoding)
        finally:
            if decoding is None:
                self._slots.release()
        return self._verdict(protocol, outcome)

    def _verdict(self, protocol: str, outcome: Any) -> Union[Admission, Refusal]:
        """What a decoding's outcome is answered: the accepted :class:`Admission` itself, or a
        :class:`Refusal` (the retryable ones counted)."""
        if outcome is _STOPPING:
            return Refusal(503, UNAVAILABLE, "the receiver is shutting down; retry", retry_after="1", close=True)
        if outcome is _BUSY:
            self.count_refusal(protocol, "decoding_budget")
            return Refusal(503, UNAVAILABLE, "the receiver's decoding memory is taken by other requests; retry later", retry_after="1")
        if isinstance(outcome, RequestTooLarge):
            return Refusal(413, RESOURCE_EXHAUSTED, str(outcome))
        if isinstance(outcome, OTLPDecodeError):
            return Refusal(400, INVALID_ARGUMENT, str(outcome))
        if not isinstance(outcome, Admission):
            return Refusal(500, INTERNAL, f"the request could not be processed: {type(outcome).__name__}")
        if not outcome.accepted:
            self.count_refusal(protocol, "queue_full")
            return Refusal(429, UNAVAILABLE, "the scoring queue is full; retry later", retry_after=str(self.retry_after()))
        return outcome

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

    def _release_slot(self, _future: Any) -> None:
        loop = self._loop
        if loop is not None and self._slots is not None:
            try:
                loop.call_soon_threadsafe(self._slots.release)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _decode_and_admit(self, body: bytes, content_type: str, signal: str = "traces", protocol: str = "http") -> Any:
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
            logger.warning("relevancy-tracer: an OTLP/%s export request failed", _WIRE_NAMES[protocol], exc_info=True)
            return exc
        finally:
            if held:
                budget.release(held)
