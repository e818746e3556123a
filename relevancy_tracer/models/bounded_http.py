"""Bounds on every model HTTP request of the ``openai`` client: one deadline over the whole
exchange, and a cap on the size of the reply.

The client's own timeouts bound each phase (connect, each read, each write) but not their sum: a
server sending a valid reply one byte every 0.3 s, or a chunked reply that never ends, keeps a
request alive for ever. And the client reads a reply whole before parsing it: a 400 MB reply
costs 1.5 GB of memory. :class:`BoundedTransport` wraps the client's transport (httpx's or
openai's aiohttp transport, proxies included) and enforces, per attempt:

* a deadline (``llm_timeout`` seconds, the ``timeout`` argument) on the whole request: connect,
  send, the reply's head and every byte of its body, with :func:`asyncio.timeout_at`; past it the
  request fails as the client's read timeout (``ReadTimeout``), which the client retries like
  any timeout (``llm_max_retries``) and reports as ``APITimeoutError``;
* a cap (``llm_max_reply_bytes``) on the reply body, decompressed: a ``Content-Length`` above it
  is refused before a byte of the body is read, otherwise the body is streamed and the request
  stops at the cap. :class:`ReplyTooLarge` is an ``openai.OpenAIError``, which the client
  raises as is, without retrying; the backends report it as ``model_error``. Only gzip and
  deflate replies are asked for (``Accept-Encoding``) and they are inflated here, chunk by chunk
  within the cap, so a compressed bomb costs no more than a plain reply; another encoding is
  refused.

Memory for a refused reply is the cap at most (plus one chunk), whatever the reply's size.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, AsyncIterator, Optional

import openai

#: Encodings the client accepts and this module inflates (within the cap).
ACCEPTED_ENCODINGS = "gzip, deflate"


def http_module() -> Any:
    """The HTTP library the installed ``openai`` client is built on (``httpx2``, or ``httpx``
    for older clients)."""
    try:
        import httpx2

        return httpx2
    except ImportError:  # pragma: no cover - older openai clients
        import httpx

        return httpx


_http = http_module()


class ReplyTooLarge(openai.OpenAIError):
    """A model reply above ``llm_max_reply_bytes`` (refused unread, or cut at the cap)."""


class ReplyEncodingRefused(openai.OpenAIError):
    """A model reply in a content encoding that was not asked for (not gzip or deflate)."""


class BoundedTransport(_http.AsyncBaseTransport):
    """An httpx transport that forwards to ``inner`` under a whole-request deadline and a reply
    size cap (see the module docstring).

    Args:
        inner: the transport requests go to (``httpx2.AsyncHTTPTransport``, openai's aiohttp
            transport, a proxy transport).
        timeout: seconds (> 0) from the start of a request to the last byte of its reply.
        max_bytes: largest reply body in bytes (> 0), after decompression.
    """

    def __init__(self, inner: Any, timeout: float, max_bytes: int):
        self._inner, self.timeout, self.max_bytes = inner, float(timeout), int(max_bytes)

    async def handle_async_request(self, request: Any) -> Any:
        """Send ``request`` through the inner transport; the reply's body streams through the
        bounds. Raises the HTTP library's ``ReadTimeout`` past the deadline, :class:`ReplyTooLarge`
        for a ``Content-Length`` above the cap, :class:`ReplyEncodingRefused`."""
        http = http_module()
        deadline = asyncio.get_running_loop().time() + self.timeout
        request.headers["Accept-Encoding"] = ACCEPTED_ENCODINGS
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._inner.handle_async_request(request)
        except TimeoutError:
            raise http.ReadTimeout(f"no reply within llm_timeout ({self.timeout:g} s)", request=request) from None
        try:
            length = response.headers.get("content-length", "")
            if length.strip().isdigit() and int(length) > self.max_bytes:
                raise ReplyTooLarge(
                    f"the model's reply of {int(length)} bytes is above llm_max_reply_bytes ({self.max_bytes}); "
                    "refused unread"
                )
            encoding = response.headers.get("content-encoding", "").strip().lower()
            if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
                raise ReplyEncodingRefused(
                    f"the model's reply is in content encoding {encoding[:40]!r}, "
                    f"not one asked for ({ACCEPTED_ENCODINGS})"
                )
        except BaseException:
            await response.aclose()
            raise
        inflate = encoding not in ("", "identity")
        headers = response.headers
        if inflate:  # inflated here: the client must not inflate again, nor expect the wire length
            dropped = ("content-encoding", "content-length")
            headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in dropped]
        body = _BoundedStream(response.stream, deadline, self.timeout, self.max_bytes, inflate, request)
        return http.Response(
            status_code=response.status_code,
            headers=headers,
            stream=body,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "BoundedTransport":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._inner.__aexit__(*exc)


class _BoundedStream(_http.AsyncByteStream):
    """A reply body read chunk by chunk before ``deadline`` (loop time), inflated when
    ``inflate``, and stopped past ``max_bytes``."""

    def __init__(self, inner: Any, deadline: float, timeout: float, max_bytes: int, inflate: bool, request: Any):
        self._inner, self._deadline, self._timeout, self._max = inner, deadline, timeout, max_bytes
        self._inflate, self._request = inflate, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        http = http_module()
        inflater = zlib.decompressobj(32 + zlib.MAX_WBITS) if self._inflate else None  # gzip or zlib header
        chunks = self._inner.__aiter__()
        total = 0
        while True:
            try:
                async with asyncio.timeout_at(self._deadline):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                message = f"the reply did not end within llm_timeout ({self._timeout:g} s)"
                raise http.ReadTimeout(message, request=self._request) from None
            if inflater is None:
                total += len(chunk)
                self._check(total)
                yield chunk
                continue
            while chunk:
                try:
                    piece = inflater.decompress(chunk, self._max - total + 1)
                except zlib.error as exc:
                    message = f"the reply's compressed body is corrupt: {exc}"
                    raise http.DecodingError(message, request=self._request) from None
                total += len(piece)
                self._check(total)
                if piece:
                    yield piece
                chunk = inflater.unconsumed_tail
        if inflater is not None:
            rest = inflater.flush()
            total += len(rest)
            self._check(total)
            if rest:
                yield rest

    def _check(self, total: int) -> None:
        if total > self._max:
            raise ReplyTooLarge(
                f"the model's reply is above llm_max_reply_bytes ({self._max} bytes); cut there, the rest unread"
            )

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_client(base: type, timeout: float, max_bytes: int, **kwargs: Any) -> Any:
    """An instance of ``base`` (an httpx ``AsyncClient`` class: openai's default or aiohttp
    client) whose transports, the direct one and each proxy's, are wrapped in
    :class:`BoundedTransport` with ``timeout`` and ``max_bytes``. ``kwargs`` go to ``base``."""

    class Bounded(base):  # type: ignore[misc, valid-type]
        def _init_transport(self, *args: Any, **kw: Any) -> Any:
            return BoundedTransport(super()._init_transport(*args, **kw), timeout, max_bytes)

        def _init_proxy_transport(self, *args: Any, **kw: Any) -> Any:
            return BoundedTransport(super()._init_proxy_transport(*args, **kw), timeout, max_bytes)

    Bounded.__name__ = Bounded.__qualname__ = "Bounded" + base.__name__
    return Bounded(**kwargs)


def default_client_class() -> Optional[type]:
    """openai's default async client class (closes itself when collected), or None."""
    from openai import _base_client

    return getattr(_base_client, "AsyncHttpxClientWrapper", None) or getattr(openai, "DefaultAsyncHttpxClient", None)
