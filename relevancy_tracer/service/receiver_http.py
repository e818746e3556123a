"""The OTLP/HTTP receiver (aiohttp's server): ``/v1/traces``, ``/v1/logs`` and ``/v1/metrics``,
protobuf or JSON, gzip or none. It bounds the connections (more than ``max_connections`` get 503
at once, :class:`_Busy`), checks a request's path, method, token, Content-Type,
Content-Encoding and declared length, reads its body within its decoding turn, and answers
what the shared admission step (:mod:`~relevancy_tracer.service.receiver_admission`) made of
it in HTTP's terms: a status, ``Retry-After``, and a ``google.rpc.Status`` body in the
request's encoding.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any, Optional, Union

from .otlp import GzipInflater, OTLPDecodeError, RequestTooLarge
from .receiver_admission import DEADLINE_EXCEEDED, INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, UNAUTHENTICATED, AdmissionStep, Refusal, export_response

#: OTLP/HTTP path of each signal.
HTTP_PATHS = {"traces": "/v1/traces", "logs": "/v1/logs", "metrics": "/v1/metrics"}


def _status(code: int, message: str) -> Any:
    from google.rpc import status_pb2

    return status_pb2.Status(code=code, message=message)


def _encode(message: Any, is_json: bool) -> bytes:
    from google.protobuf import json_format

    return json_format.MessageToJson(message, indent=None).encode() if is_json else message.SerializeToString()


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


class HTTPReceiver(AdmissionStep):
    """The OTLP/HTTP half of :class:`~relevancy_tracer.service.receiver.OTLPServer`, which
    makes its listener (:meth:`_listen`) on the receivers' event loop and stops it."""

    host: str
    http_port: Optional[int]
    _web: Any
    _listener: Any

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
        verdict = await self._admit("http", signal, content_type, lambda: self._read(request, encoding == "gzip"))
        if isinstance(verdict, Refusal):
            response = error(verdict.status, verdict.code, verdict.message, {"Retry-After": verdict.retry_after} if verdict.retry_after is not None else None)
            if verdict.close:
                response.force_close()
            return response
        return web.Response(body=_encode(export_response(verdict, signal), is_json), content_type="application/json" if is_json else "application/x-protobuf")

    async def _read(self, request: Any, gzip: bool) -> Union[bytes, Refusal]:
        """The body of a request that has its decoding turn (after ``100 Continue`` when the
        client waits for it), or why not: 408 when it does not arrive within ``body_timeout``
        (the connection closed), 413 above ``max_request_bytes``, 400 for corrupt gzip or a
        malformed body (bad chunk framing, a short body: the connection closed)."""
        from aiohttp import web

        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            return await asyncio.wait_for(self._read_body(request, gzip), self.limits.body_timeout)
        except asyncio.TimeoutError:
            return Refusal(408, DEADLINE_EXCEEDED, f"the body did not arrive within {self.limits.body_timeout:g} s", close=True)
        except RequestTooLarge as exc:
            return Refusal(413, RESOURCE_EXHAUSTED, f"{exc} (max_request_bytes)")
        except OTLPDecodeError as exc:
            return Refusal(400, INVALID_ARGUMENT, str(exc))
        except web.HTTPException:
            raise
        except Exception as exc:  # aiohttp's payload errors: bad chunk framing, a short body
            return Refusal(400, INVALID_ARGUMENT, f"bad request body: {exc}", close=True)

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
