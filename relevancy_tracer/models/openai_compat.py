"""OpenAI-compatible chat and embeddings through the official ``openai`` client.

Works with OpenAI, Azure OpenAI (its ``/openai/v1`` endpoint), vLLM, Ollama and llama.cpp's
server. Retries with exponential backoff and jitter on 408/409/429/5xx, connection errors and
timeouts are the ``openai`` client's own (``max_retries``); each attempt is bounded as a whole
(``timeout``: connect, head and body) and its reply in size (``max_reply_bytes``) by the
client's transport (:mod:`~relevancy_tracer.models.bounded_http`).

JSON output is requested with ``response_format`` (``json_object`` by default, ``json_schema``
on request); a server that rejects the parameter with HTTP 400 is asked again without it, and
the backend remembers not to send it again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from .._background import fork as _fork
from .._background.loop import is_owned_loop, register_loop_closer
from .base import ChatReply, EmbeddingReply, ModelError

logger = logging.getLogger("relevancy_tracer")

#: The default of the ``llm_max_reply_bytes`` setting (config.py; a test checks they agree).
DEFAULT_MAX_REPLY_BYTES = 8 * 1024 * 1024

#: Sent to keyless local servers (vLLM, Ollama, llama.cpp) so the client does not refuse to start.
PLACEHOLDER_API_KEY = "EMPTY"


_pools: "weakref.WeakSet[_ClientPool]" = weakref.WeakSet()


#: Close tasks of the clients of collected pools, kept referenced until they finish.
_closing: "set[asyncio.Task]" = set()


@_fork.after_fork
def _forget_closing() -> None:
    _closing.clear()  # tasks of the parent's loops


async def _close_quietly(client: Any) -> None:
    try:
        await client.close()
    except Exception:
        pass


def _close_clients_later(clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]") -> None:
    """Finalizer of a collected pool (an engine that went away, an evicted model override):
    schedule the close of each of its clients on the loop it belongs to, when that loop runs."""

    def start(client: Any) -> None:
        task = asyncio.get_running_loop().create_task(_close_quietly(client))
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    for loop, client in list(clients.items()):
        try:
            if not loop.is_closed():
                loop.call_soon_threadsafe(start, client)
        except Exception:  # the loop closed meanwhile: nothing left to release
            pass


async def close_clients_of_running_loop() -> None:
    """Close every client bound to the running loop (its aiohttp session must not leak), and
    wait for the closes scheduled by collected pools."""
    loop = asyncio.get_running_loop()
    for pool in list(_pools):
        with pool._lock:
            client = pool._clients.pop(loop, None)
        if client is not None:
            await _close_quietly(client)
    pending = [task for task in list(_closing) if task.get_loop() is loop and not task.done()]
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


register_loop_closer(close_clients_of_running_loop)


class _ClientPool:
    """One ``AsyncOpenAI`` client per event loop.

    An async HTTP client is bound to the loop it first ran on; the package runs one long-lived
    loop (so it pools connections), while ``score()`` may run a fresh loop per call. Loops this
    package owns get the faster aiohttp transport, closed with the loop; a caller's own loop
    (``await ascore()`` under ``asyncio.run``) gets openai's default httpx transport, which
    needs no closing, so no aiohttp session is left unclosed when that loop ends.
    """

    def __init__(self, base_url: Optional[str], api_key: Optional[str], timeout: float, max_retries: int, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES):
        self._max_reply_bytes = max_reply_bytes
        self._base_url = base_url
        self._api_key = api_key
        self._timeout = timeout
        self._max_retries = max_retries
        self._clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        _pools.add(self)
        _fork.renew_after_fork(self, _ClientPool._renew_after_fork)
        finalizer = weakref.finalize(self, _close_clients_later, self._clients)
        finalizer.atexit = False  # at exit the loops' closers close the live pools' clients

    def _renew_after_fork(self) -> None:
        """In a forked child: the parent's clients belong to the parent's loops; forget them."""
        self._lock = threading.Lock()
        self._clients = weakref.WeakKeyDictionary()

    def get(self) -> Any:
        import openai

        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                api_key = self._api_key
                if not api_key and self._base_url:
                    api_key = PLACEHOLDER_API_KEY
                try:
                    client = openai.AsyncOpenAI(
                        api_key=api_key or None,
                        base_url=self._base_url or None,
                        timeout=self._timeout,
                        max_retries=self._max_retries,
                        http_client=self._http_client(is_owned_loop(loop)),
                    )
                except openai.OpenAIError as exc:  # e.g. no API key anywhere
                    raise ModelError(f"cannot create the OpenAI client: {exc}") from exc
                self._clients[loop] = client
            return client

    def _http_client(self, owned_loop: bool) -> Any:
        """The client's HTTP client, its transports under the whole-request deadline
        (``timeout``) and the reply cap (``max_reply_bytes``) of
        :mod:`~relevancy_tracer.models.bounded_http`: openai's aiohttp client on a loop this
        package owns (when installed), else openai's default httpx client."""
        from .bounded_http import bounded_client, default_client_class

        base = _aiohttp_client_class() if owned_loop else None
        if base is not None:
            try:
                return bounded_client(base, self._timeout, self._max_reply_bytes)
            except Exception:  # aiohttp missing or incompatible: the default transport works
                pass
        return bounded_client(default_client_class(), self._timeout, self._max_reply_bytes)


def _aiohttp_client_class() -> Any:
    """openai's aiohttp client class when ``openai[aiohttp]`` is installed, else None (httpx).

    Measured in benchmarks/throughput.py: the client's CPU per chat + embeddings pair drops from
    about 10 ms to 5.5 ms, the largest cost of an evaluation against a fast endpoint.
    """
    import openai

    factory = getattr(openai, "DefaultAioHttpClient", None)
    if factory is None or getattr(factory, "__name__", "").startswith("_Missing"):
        return None
    return factory


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    text = str(exc) or name
    return f"{name} (HTTP {status}): {text}" if status else f"{name}: {text}"


class OpenAIChatModel:
    """A :class:`~relevancy_tracer.models.base.ChatModel` over an OpenAI-compatible endpoint.

    Args:
        model: model name sent with each request (e.g. ``gpt-4o-mini``, a vLLM model id).
        base_url: endpoint base URL, or None for the client's default.
        api_key: key; None falls back to the client's ``OPENAI_API_KEY`` handling.
        timeout: seconds for one HTTP request attempt, whole: connect, send, the reply's head
            and all of its body. max_retries: retries per request (client backoff).
        response_format: ``json_object``, ``json_schema`` or ``none``.
        max_reply_bytes: largest reply body (decompressed); a larger one is refused without
            being read whole (``ModelError``).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        response_format: str = "json_object",
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ):
        self.name = model
        self._pool = _ClientPool(base_url, api_key, timeout, max_retries, max_reply_bytes)
        self._response_format = response_format
        self._token_param = "max_tokens"
        self._logprobs = True  # switched off for servers that reject the parameter

    def _format_param(self, schema: dict) -> Optional[dict]:
        if self._response_format == "json_object":
            return {"type": "json_object"}
        if self._response_format == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        return None

    async def chat_json(
        self,
        messages: Sequence[dict],
        schema: dict,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: Optional[int] = None,
        score_key: Optional[str] = None,
    ) -> ChatReply:
        import openai

        client = self._pool.get()
        for _ in range(4):  # at most: drop response_format, switch token parameter, drop logprobs
            kwargs: dict[str, Any] = {
                "model": self.name,
                "messages": list(messages),
                "temperature": temperature,
                self._token_param: max_tokens,
            }
            if seed is not None:
                kwargs["seed"] = seed
            response_format = self._format_param(schema)
            if response_format is not None:
                kwargs["response_format"] = response_format
            want_logprobs = bool(score_key) and self._logprobs
            if want_logprobs:
                kwargs["logprobs"] = True
                kwargs["top_logprobs"] = 10
            try:
                response = await client.chat.completions.create(**kwargs)
            except openai.BadRequestError as exc:
                text = str(exc).lower()
                if want_logprobs and "logprobs" in text:
                    logger.info("relevancy-tracer: %s rejects logprobs; judge scores use the sampled number", self.name)
                    self._logprobs = False
                    continue
                if response_format is not None and "response_format" in text:
                    logger.info("relevancy-tracer: %s rejects response_format; asking without it", self.name)
                    self._response_format = "none"
                    continue
                if self._token_param == "max_tokens" and "max_completion_tokens" in text:
                    self._token_param = "max_completion_tokens"
                    continue
                raise ModelError(_describe(exc)) from exc
            except openai.OpenAIError as exc:
                raise ModelError(_describe(exc)) from exc
            reply = _chat_reply(response, self.name)
            if want_logprobs:
                reply.score_probs = digit_distribution(response, score_key)  # type: ignore[arg-type]
            return reply
        raise ModelError("the server rejected every request variant")


def digit_distribution(response: Any, key: str) -> Optional[dict[int, float]]:
    """Digit probabilities at the first digit of ``"<key>":`` from a reply's ``logprobs``.

    Walks ``choices[0].logprobs.content``, rebuilding the text token by token; at the first token
    holding a digit after ``"<key>":`` it sums the ``top_logprobs`` mass of each digit (tokens
    like " 7" count as 7) and normalises over the digits. None when the server sent no logprobs,
    or a malformed one (not a number, not finite, above 0): the judge then reads the sampled
    number. Never raises for what the server sent.
    """
    try:
        content = response.choices[0].logprobs.content
    except (AttributeError, IndexError, TypeError):
        return None
    if not content:
        return None
    pattern = re.compile(r'"' + re.escape(key) + r'"\s*:\s*$')
    text = ""
    for item in content:
        token = getattr(item, "token", "") or ""
        if token.strip()[:1].isdigit() and pattern.search(text + token[: len(token) - len(token.lstrip())]):
            probs: dict[int, float] = {}
            for alternative in getattr(item, "top_logprobs", None) or []:
                alt = getattr(alternative, "token", "") or ""
                alt = alt.strip() if isinstance(alt, str) else ""
                if alt[:1] and alt[0] in "0123456789":
                    logprob = _logprob(getattr(alternative, "logprob", None))
                    if logprob is None:  # a malformed reply: the judge falls back on the sampled number
                        logger.debug("relevancy-tracer: %s sent an unreadable logprob; using the sampled number", key)
                        return None
                    probs[int(alt[0])] = probs.get(int(alt[0]), 0.0) + math.exp(logprob)
            total = sum(probs.values())
            return {d: p / total for d, p in probs.items()} if total > 0 else None
        text += token if isinstance(token, str) else ""
    return None


def _logprob(value: Any) -> Optional[float]:
    """A log probability as a float, or None when it is not one: not a real number (a string,
    a bool), not finite, or above 0 beyond rounding (``exp`` of 1000.0 overflows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or value > 1e-6:
        return None
    return min(value, 0.0)


def _chat_reply(response: Any, default_model: str) -> ChatReply:
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise ModelError("chat completion has no choices")
    message = choices[0].message
    text = getattr(message, "content", None) or ""
    usage = getattr(response, "usage", None)
    return ChatReply(
        text=text,
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        model=getattr(response, "model", None) or default_model,
        finish_reason=getattr(choices[0], "finish_reason", None),
    )


class OpenAIEmbedder:
    """An :class:`~relevancy_tracer.models.base.Embedder` over an OpenAI-compatible endpoint.

    All texts go in one ``embeddings.create`` request; rows are returned in input order
    (sorted by the reply's ``index``). Vectors are float32 (n, d), as the server sent them.
    ``timeout``, ``max_retries`` and ``max_reply_bytes`` as for :class:`OpenAIChatModel`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ):
        self.name = model
        self._pool = _ClientPool(base_url, api_key, timeout, max_retries, max_reply_bytes)

    async def embed(self, texts: Sequence[str]) -> EmbeddingReply:
        import openai

        client = self._pool.get()
        try:
            response = await client.embeddings.create(model=self.name, input=list(texts))
        except openai.OpenAIError as exc:
            raise ModelError(_describe(exc)) from exc
        data = sorted(getattr(response, "data", None) or [], key=lambda item: getattr(item, "index", 0))
        try:
            vectors = np.asarray([item.embedding for item in data], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ModelError(f"embeddings reply is not a numeric matrix: {exc}") from exc
        if vectors.ndim != 2 and len(data) > 0:
            raise ModelError(f"embeddings reply has shape {vectors.shape}, expected (n, d)")
        usage = getattr(response, "usage", None)
        return EmbeddingReply(
            vectors=vectors.reshape(len(data), -1) if len(data) else np.zeros((0, 0), np.float32),
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            model=getattr(response, "model", None) or self.name,
        )
