"""The OTLP/gRPC receiver (grpcio's asyncio server): ``TraceService/Export``,
``LogsService/Export`` and ``MetricsService/Export``. grpcio bounds the connections, the calls
and the message size; the token is checked from a call's metadata before its message is read
(:func:`_TokenCheck`); the message is read within the call's decoding turn, and what the
shared admission step (:mod:`~relevancy_tracer.service.receiver_admission`) made of it is
answered in gRPC's terms: a status code, and a ``retry-after`` trailer for a retryable refusal.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Optional, Union

from ..config import MAX_INT32
from .receiver_admission import DEADLINE_EXCEEDED, INVALID_ARGUMENT, Admission, AdmissionStep, Refusal, export_response

#: gRPC service of each signal.
GRPC_SERVICES = {"traces": "opentelemetry.proto.collector.trace.v1.TraceService", "logs": "opentelemetry.proto.collector.logs.v1.LogsService", "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService"}


class GRPCReceiver(AdmissionStep):
    """The OTLP/gRPC half of :class:`~relevancy_tracer.service.receiver.OTLPServer`, which
    starts its server (:meth:`_listen_grpc`) on the receivers' event loop and stops it."""

    host: str
    tls: bool
    grpc_port: Optional[int]
    _grpc: Any
    _tls_files: tuple[Optional[str], Optional[str]]

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

        async def read() -> Union[bytes, Refusal]:
            try:
                raw = await asyncio.wait_for(context.read(), self.limits.body_timeout)
            except asyncio.TimeoutError:
                raw = None
            if raw is None:
                return Refusal(408, DEADLINE_EXCEEDED, f"the request message did not arrive within {self.limits.body_timeout:g} s")
            if raw is grpc.aio.EOF:
                return Refusal(400, INVALID_ARGUMENT, "no request message")
            return raw

        verdict = await self._admit("grpc", signal, "application/x-protobuf", read)
        if isinstance(verdict, Admission):
            return export_response(verdict, signal)
        if verdict.retry_after is not None:
            context.set_trailing_metadata((("retry-after", verdict.retry_after),))
        await _abort(context, _status_code(verdict.code), verdict.message)


def _status_code(code: int) -> Any:
    """The ``grpc.StatusCode`` of a ``google.rpc.Code`` value."""
    import grpc

    return next(status for status in grpc.StatusCode if status.value[0] == code)


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

        def __init__(self, server: AdmissionStep):
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


def _TokenCheck(server: AdmissionStep) -> Any:  # noqa: N802 - builds the interceptor (grpc imported lazily)
    """The bearer-token interceptor of ``server``'s gRPC receiver."""
    global _token_check
    if _token_check is None:
        _token_check = _token_check_class()
    return _token_check(server)


_token_check: Any = None
