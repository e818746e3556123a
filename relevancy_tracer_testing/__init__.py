"""The lab's test servers on 127.0.0.1, shared by ``tests/`` and ``benchmarks/``: a scriptable
OpenAI-compatible server (:class:`FakeOpenAIServer`), an OTLP receiver (:class:`OTLPReceiver`),
a Redis launcher (:class:`RedisServer`) and scripted models for the model host
(:class:`FakeHostChatModel`, :class:`FakeHostEmbedder`, :class:`PacedHostChatModel`: call
:func:`use_scripted_host_models`, then name them ``llm_model="fake-host-chat"`` etc.).

Not part of the product: this package sits beside ``relevancy_tracer/`` in the checkout and is
not in the wheel (pyproject.toml discovers only ``relevancy_tracer.*``; ``tests/test_wheel.py`` checks
it). Users testing their own apps need none of it: the fake server's default replies answer this
package's own prompts and its scripts inject the faults the tracer is tested against. It is
importable from the repository root (pytest's rootdir, ``python -m benchmarks.NAME``).

The OpenAI-compatible server serves ``POST /v1/chat/completions`` (``stream: true`` too, as
server-sent events), ``POST /v1/embeddings`` and ``GET /v1/models`` over real
HTTP/1.1 (keep-alive), so the ``openai`` client's timeouts, retries and connection handling are
exercised for real. Replies are either scripted (a queue per endpoint) or produced by default
responders that understand this package's prompts. Every request body is recorded.

Example::

    with FakeOpenAIServer() as server:
        server.chat.push(Status(429), '{"questions": [...], "noncommittal": [0, 0, 0]}')
        relevancy_tracer.score(q, a, llm="openai", llm_base_url=server.base_url, ...)
        assert len(server.requests_to("chat")) == 2

Script items: a ``str`` (200 with that message content), :class:`Status` (an HTTP error),
:class:`Delay` (wait, then another item), :class:`Drop` (close the connection without a reply),
:class:`Hang` (never reply until the server stops), :class:`Raw` (a 200 with any JSON body),
:class:`Dribble` (a valid reply a byte at a time), :class:`Endless` (a chunked body that never
ends), :class:`Huge` (a reply of any size, generated as it is sent), :class:`Gzipped` (a gzip
reply, or a gzip bomb).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, Union

from relevancy_tracer.scoring import prompts
from relevancy_tracer.service.otlp import attributes as _attributes

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def count_tokens(text: str) -> int:
    """A tokenizer-free token count (words and punctuation), used for usage figures."""
    return len(_TOKEN.findall(text or ""))


@dataclass
class Status:
    """Reply with HTTP ``code`` and an OpenAI-style error body."""

    code: int
    message: str = "scripted error"
    headers: dict = field(default_factory=dict)


@dataclass
class Delay:
    """Wait ``seconds``, then serve ``then`` (default: the default responder)."""

    seconds: float
    then: Any = None


@dataclass
class Gate:
    """Wait until ``event`` (a ``threading.Event``) is set, then serve ``then`` (default: the
    default responder): deterministic slowness, opened by the test."""

    event: threading.Event
    then: Any = None


@dataclass
class Drop:
    """Close the connection without sending a response."""


@dataclass
class Hang:
    """Never reply (until the server stops)."""


@dataclass
class Raw:
    """Reply 200 with this JSON body as is (for malformed or unusual replies)."""

    body: Any


@dataclass
class Dribble:
    """Reply 200 with a valid reply (the default responder's), its body sent ``size`` bytes
    every ``interval`` seconds: a reply that arrives, slowly, for ever or nearly."""

    interval: float = 0.3
    size: int = 1


@dataclass
class Endless:
    """Reply 200 with a chunked body that never ends: a chunk of ``size`` bytes every
    ``interval`` seconds until the client goes away or the server stops."""

    interval: float = 0.1
    size: int = 1


@dataclass
class Huge:
    """Reply 200 with a JSON body of ``size`` bytes (a chat completion whose content is
    ``size`` bytes long), generated 1 MiB at a time, so the server holds none of it; with
    ``Content-Length`` unless ``chunked``. Stops when the client goes away."""

    size: int
    chunked: bool = False


@dataclass
class Gzipped:
    """Reply 200 with ``Content-Encoding: gzip``: the default reply compressed, or, with
    ``bomb`` set, a gzip stream inflating to ``bomb`` bytes of spaces (compressed as it is sent:
    about 1 KB on the wire per MB inflated)."""

    bomb: int = 0


ScriptItem = Union[str, Status, Delay, Gate, Drop, Hang, Raw, Dribble, Endless, Huge, Gzipped]


class Script:
    """A thread-safe queue of scripted replies for one endpoint; empty means default replies."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self._lock = threading.Lock()

    def push(self, *items: ScriptItem) -> None:
        with self._lock:
            self._items.extend(items)

    def pop(self) -> Optional[ScriptItem]:
        with self._lock:
            return self._items.popleft() if self._items else None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


# ------------------------------------------------------------------------------- default replies


def _user_text(body: dict) -> str:
    messages = body.get("messages") or []
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _tagged(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.DOTALL)
    return match.group(1).strip() if match else ""


def default_chat_reply(body: dict) -> str:
    """A valid reply to any of this package's prompts (and ``{}`` to anything else).

    Generated questions restate the answer's first sentence as a question, so the fake
    embeddings give a complete, on-topic answer a higher similarity than an unrelated one.
    """
    text = _user_text(body)
    answer = _tagged(text, "answer")
    first = re.split(r"(?<=[.!?。])\s*", answer)[0].rstrip(".!?。") if answer else "this"
    # the default's conversation states both tasks in its system message; its user turns name them
    if prompts.JUDGE_TURN in text:
        return json.dumps({"score": 4})
    if "<conversation>" in text:  # the standalone rewrite: the last turn, then the conversation's first user turn
        opening = re.search(r"^User: (.*)$", _tagged(text, "conversation"), re.M)
        topic = opening.group(1).strip() if opening else "the conversation"
        return json.dumps({"question": f"{_tagged(text, 'question')} (in a conversation about: {topic})"})
    if '"noncommittal": [' in text or prompts.QUESTIONS_TURN in text:
        count = re.search(r"write (?:the )?(\d+) (?:different )?questions", text)
        n = int(count.group(1)) if count else 3
        evasive = bool(re.search(r"\b(don't know|not sure|no idea|cannot answer)\b", answer, re.I))
        questions = [f"{prefix} {first}?" for prefix in ("What about", "Can you explain", "Tell me whether", "Is it true that", "Why")[:n]]
        questions += [f"Question {i} about {first}?" for i in range(len(questions), n)]
        return json.dumps({"questions": questions, "noncommittal": [int(evasive)] * n})
    if '"question": "..."' in text:
        return json.dumps({"question": f"What about {first}?", "noncommittal": 0})
    if '"ratings"' in text:
        n = len(re.findall(r"^\d+\. ", _tagged(text, "generated_questions"), re.M)) or 3
        return json.dumps({"ratings": [0.75] * n})
    if '"sub_questions"' in text:
        return json.dumps({"sub_questions": [s.strip() + "?" for s in re.split(r"\band\b|,|\?", _tagged(text, "question")) if s.strip()][:5] or ["What is asked?"]})
    if '"addressed"' in text:
        n = len(re.findall(r"^\d+\. ", _tagged(text, "sub_questions"), re.M)) or 1
        return json.dumps({"addressed": [True] * n})
    if '"intent"' in text:
        return json.dumps({"intent": "The asker wants the information the question names."})
    if '"score"' in text:
        return json.dumps({"score": 4})
    return "{}"


def fake_logprobs(text: str, spread: tuple[tuple[int, float], ...] = ((0, 0.6), (1, 0.3), (-1, 0.1))) -> dict:
    """OpenAI-style ``logprobs`` for ``text``: every digit gets ``top_logprobs`` spread over
    neighbouring digits (by default 0.6 on itself, 0.3 one above, 0.1 one below), so an expected
    value differs from the sampled digit (``{"score": 4}`` gives 4.2)."""
    content = []
    for token in re.findall(r"\d|\D+", text):
        if token.isdigit():
            alternatives = [{"token": str(int(token) + offset), "logprob": math.log(p), "bytes": None} for offset, p in spread if 0 <= int(token) + offset <= 9]
            content.append({"token": token, "logprob": alternatives[0]["logprob"], "bytes": None, "top_logprobs": alternatives})
        else:
            content.append({"token": token, "logprob": 0.0, "bytes": None, "top_logprobs": [{"token": token, "logprob": 0.0, "bytes": None}]})
    return {"content": content}


def hashed_embedding(text: str, dims: int = 64) -> list[float]:
    """A deterministic bag-of-words embedding: texts sharing words get similar vectors."""
    vector = [0.0] * dims
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector] if any(vector) else [1.0 / math.sqrt(dims)] * dims


# ------------------------------------------------------------------- models for the model host

#: Environment variable naming a file: while it exists, :class:`FakeHostChatModel` holds every
#: request (so a test can have evaluations in flight in the model host, then kill the host).
HOLD_FILE_ENV = "RELEVANCY_TRACER_TEST_HOLD_FILE"


class FakeHostChatModel:
    """A scripted :class:`~relevancy_tracer.models.base.ChatModel` the model host can run
    instead of llama.cpp (``llm_model="fake-host-chat"`` after :func:`use_scripted_host_models`): replies
    :func:`default_chat_reply`, instantly, unless the file named by :data:`HOLD_FILE_ENV`
    exists, in which case each request waits until it is removed."""

    name = "fake-host-chat"

    async def chat_json(self, messages: Any, schema: dict, *, max_tokens: int, temperature: float = 0.0, seed: Optional[int] = None, score_key: Optional[str] = None) -> Any:
        import asyncio
        import os

        from relevancy_tracer.models.base import ChatReply

        hold = os.environ.get(HOLD_FILE_ENV)
        while hold and os.path.exists(hold):
            await asyncio.sleep(0.02)
        return ChatReply(text=default_chat_reply({"messages": list(messages)}), model=self.name, finish_reason="stop")

    def generate(self, messages: Any, *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        return "generated: " + _user_text({"messages": list(messages)})[:max_tokens]


class FakeHostEmbedder:
    """:func:`hashed_embedding` as an :class:`~relevancy_tracer.models.base.Embedder` for the
    model host (``embedding_model="fake-host-embed"`` after :func:`use_scripted_host_models`)."""

    name = "fake-host-embed"

    async def embed(self, texts: Any) -> Any:
        import numpy as np

        from relevancy_tracer.models.base import EmbeddingReply

        return EmbeddingReply(vectors=np.asarray([hashed_embedding(t) for t in texts], dtype=np.float32), model=self.name)


#: Environment variable: seconds :class:`PacedHostChatModel` takes per request (default 2.5).
PACE_ENV = "MODEL_HOST_BENCH_PACE"


class PacedHostChatModel:
    """:class:`FakeHostChatModel` answering one request at a time after :data:`PACE_ENV`
    seconds (asleep: no CPU), so evaluations finish at about the embedded model's rate while
    the app's process does all of its own per-evaluation work (``llm_model="paced-host-chat"``;
    ``benchmarks.model_host``'s ``paced-host`` variant)."""

    name = "paced-host-chat"

    def __init__(self) -> None:
        import os

        self._scripted = FakeHostChatModel()
        self._pace = float(os.environ.get(PACE_ENV, "2.5"))
        self._lock: Any = None

    async def chat_json(self, messages: Any, schema: dict, **options: Any) -> Any:
        import asyncio

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await asyncio.sleep(self._pace)
            return await self._scripted.chat_json(messages, schema, **options)


#: The scripted models by the name ``llm_model`` / ``embedding_model`` gives them.
SCRIPTED_HOST_MODELS: dict[str, Callable[[], Any]] = {
    FakeHostChatModel.name: FakeHostChatModel,
    FakeHostEmbedder.name: FakeHostEmbedder,
    PacedHostChatModel.name: PacedHostChatModel,
}


def use_scripted_host_models() -> None:
    """Let this process's model hosts serve :data:`SCRIPTED_HOST_MODELS` (``llm_model=
    "fake-host-chat"``, ``embedding_model="fake-host-embed"``, ``llm_model="paced-host-chat"``):
    hosts then start as ``python -m relevancy_tracer_testing.model_host``, which registers the
    same models. Call it in every process that configures the tracer with them (forked
    children inherit it). The product has no other way to load a model that is not a local
    one: no setting reaches this."""
    from relevancy_tracer.models import host

    host.serve_extra_models(SCRIPTED_HOST_MODELS, "relevancy_tracer_testing.model_host")


# ------------------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers on a keep-alive connection (~40 ms on Linux), which
    # would add to every reply's scripted delay.
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send_json(self, code: int, body: Any, headers: Optional[dict] = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, response: dict, usage: bool) -> None:
        """A chat completion as OpenAI's server-sent events (``stream: true``): per choice a
        role delta, the content in two deltas and a finish chunk; the usage chunk when asked
        (``stream_options.include_usage``); then ``[DONE]``."""
        base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"], "model": response["model"]}
        chunks = []
        for choice in response["choices"]:
            text = choice["message"]["content"] or ""
            index = choice["index"]
            chunks.append({**base, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                chunks.append({**base, "choices": [{"index": index, "delta": {"content": piece}, "finish_reason": None}]})
            chunks.append({**base, "choices": [{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}]})
        if usage:
            chunks.append({**base, "choices": [], "usage": response["usage"]})
        data = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks).encode("utf-8") + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_hostile(self, owner: "FakeOpenAIServer", kind: str, body: dict, item: Any) -> None:
        """A :class:`Dribble`, :class:`Endless` or :class:`Huge` reply."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if isinstance(item, Dribble):
            reply = owner._chat_response(body, None) if kind == "chat" else owner._embedding_response(body)
            data = json.dumps(reply).encode("utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for start in range(0, len(data), item.size):
                if owner._stopped.wait(item.interval):
                    return
                self.wfile.write(data[start : start + item.size])
                self.wfile.flush()
            return
        if isinstance(item, Gzipped):
            import zlib

            compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data: bytes) -> None:
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

            if item.bomb:
                block, left = b" " * (1 << 20), item.bomb
                while left > 0 and not owner._stopped.is_set():
                    chunk(compressor.compress(block[: min(left, len(block))]))
                    left -= len(block)
            else:
                reply = owner._chat_response(body, None) if kind == "chat" else owner._embedding_response(body)
                chunk(compressor.compress(json.dumps(reply).encode("utf-8")))
            chunk(compressor.flush())
            self.wfile.write(b"0\r\n\r\n")
            return
        if isinstance(item, Endless):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while not owner._stopped.wait(item.interval):
                self.wfile.write(b"%x\r\n%s\r\n" % (item.size, b" " * item.size))
                self.wfile.flush()
            return
        head = b'{"id": "huge", "object": "chat.completion", "created": 0, "model": "fake-chat", "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "'
        tail = b'"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
        filler = item.size - len(head) - len(tail)
        if item.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(item.size))
        self.end_headers()
        block = b"x" * (1 << 20)

        def send(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if item.chunked else data)

        send(head)
        while filler > 0 and not owner._stopped.is_set():
            send(block[: min(filler, len(block))])
            filler -= len(block)
        send(tail)
        if item.chunked:
            self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": [{"id": "fake-chat", "object": "model"}, {"id": "fake-embed", "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_json(400, {"error": {"message": "invalid JSON body"}})
            return
        if self.path.rstrip("/").endswith("/chat/completions"):
            kind = "chat"
        elif self.path.rstrip("/").endswith("/embeddings"):
            kind = "embeddings"
        else:
            self._send_json(404, {"error": {"message": f"unknown path {self.path}"}})
            return
        owner._record(kind, body, dict(self.headers))
        owner._enter(kind)
        try:
            self._serve(owner, kind, body)
        finally:
            owner._leave(kind)

    def _serve(self, owner: "FakeOpenAIServer", kind: str, body: dict) -> None:
        script = owner.chat if kind == "chat" else owner.embeddings
        item: Any = script.pop()
        base_delay = owner.chat_delay if kind == "chat" else owner.embedding_delay
        if base_delay:
            owner._stopped.wait(base_delay)
        while isinstance(item, (Delay, Gate)):
            if isinstance(item, Gate):
                while not item.event.wait(0.05) and not owner._stopped.is_set():
                    pass
            else:
                owner._stopped.wait(item.seconds)
            item = item.then
        if isinstance(item, Hang):
            owner._stopped.wait()
            self.close_connection = True
            return
        if isinstance(item, Drop):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if isinstance(item, Status):
            self._send_json(item.code, {"error": {"message": item.message, "type": "scripted", "code": item.code}}, item.headers)
            return
        if isinstance(item, Raw):
            self._send_json(200, item.body)
            return
        if isinstance(item, (Dribble, Endless, Huge, Gzipped)):
            try:
                self._send_hostile(owner, kind, body, item)
            except OSError:  # the client went away: what these replies are for
                pass
            self.close_connection = True
            return
        if kind == "chat" and body.get("stream"):
            self._send_stream(owner._chat_response(body, item), bool((body.get("stream_options") or {}).get("include_usage")))
        elif kind == "chat":
            self._send_json(200, owner._chat_response(body, item))
        else:
            self._send_json(200, owner._embedding_response(body))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog is 5: a burst of new connections (an async client opening
    # one per concurrent request) overflows it and the dropped SYNs are retried after 1 s.
    request_queue_size = 256
    owner: "FakeOpenAIServer"


class _Served:
    """A context manager: ``with X() as x`` starts it (``start()`` returns it) and stops it."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class FakeOpenAIServer(_Served):
    """An OpenAI-compatible server on 127.0.0.1 and a free port, in a background thread.

    Args:
        chat_delay, embedding_delay: seconds added to every chat / embeddings request
            (the throughput benchmark uses 0.1 and 0.01).
        chat_responder: ``fn(request_body) -> str`` for unscripted chat replies
            (default :func:`default_chat_reply`).
        embedder: ``fn(text) -> list[float]`` for unscripted embeddings
            (default :func:`hashed_embedding`).

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``. chat, embeddings: :class:`Script` queues.
        requests: list of ``(kind, body)`` for every request received.
        max_in_flight: the most requests the server was handling at once.
        max_in_flight_by_kind: the same per kind (``{"chat": n, "embeddings": m}``).
    """

    def __init__(
        self,
        *,
        chat_delay: float = 0.0,
        embedding_delay: float = 0.0,
        chat_responder: Optional[Callable[[dict], str]] = None,
        embedder: Optional[Callable[[str], list[float]]] = None,
    ):
        self.chat_delay = chat_delay
        self.embedding_delay = embedding_delay
        self.chat_responder = chat_responder or default_chat_reply
        self.embedder = embedder or hashed_embedding
        self.chat = Script()
        self.embeddings = Script()
        self.requests: list[tuple[str, dict]] = []
        self.headers: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.max_in_flight_by_kind: dict[str, int] = {}
        self._in_flight_by_kind: dict[str, int] = {}
        self._lock = threading.Lock()
        self._received = threading.Condition(self._lock)
        self._stopped = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle
    def start(self) -> "FakeOpenAIServer":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)


    # -- inspection
    def _record(self, kind: str, body: dict, headers: dict) -> None:
        with self._received:
            self.requests.append((kind, body))
            self.headers.append(headers)
            self._received.notify_all()

    def wait_for_requests(self, kind: str, count: int, timeout: float = 10.0) -> bool:
        """Block until ``count`` requests to ``chat`` or ``embeddings`` were received; False on
        timeout."""
        with self._received:
            return self._received.wait_for(lambda: sum(1 for k, _ in self.requests if k == kind) >= count, timeout)

    def _enter(self, kind: str) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            now = self._in_flight_by_kind[kind] = self._in_flight_by_kind.get(kind, 0) + 1
            self.max_in_flight_by_kind[kind] = max(self.max_in_flight_by_kind.get(kind, 0), now)

    def _leave(self, kind: str) -> None:
        with self._lock:
            self.in_flight -= 1
            self._in_flight_by_kind[kind] -= 1

    def requests_to(self, kind: str) -> list[dict]:
        """Bodies of the requests received on ``chat`` or ``embeddings``."""
        with self._lock:
            return [body for k, body in self.requests if k == kind]

    # -- responses
    def _chat_response(self, body: dict, scripted: Optional[str]) -> dict:
        n = int(body.get("n") or 1)
        texts = [scripted if isinstance(scripted, str) else self.chat_responder(body) for _ in range(n)]
        prompt_tokens = sum(count_tokens(m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))) for m in body.get("messages") or [])
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake-chat"),
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop", **({"logprobs": fake_logprobs(t)} if body.get("logprobs") else {})}
                for i, t in enumerate(texts)
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sum(count_tokens(t) for t in texts), "total_tokens": prompt_tokens + sum(count_tokens(t) for t in texts)},
        }

    def _embedding_response(self, body: dict) -> dict:
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        vectors: list[Any] = [self.embedder(t if isinstance(t, str) else json.dumps(t)) for t in texts]
        if body.get("encoding_format") == "base64":  # what openai 1.x clients ask for by default
            vectors = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii") for v in vectors]
        tokens = sum(count_tokens(t) for t in texts if isinstance(t, str))
        return {
            "object": "list",
            "model": body.get("model", "fake-embed"),
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


# ------------------------------------------------------------------------------- OTLP receiver


class OTLPReceiver(_Served):
    """A minimal OTLP receiver on 127.0.0.1: OTLP/HTTP (protobuf, gzip) and OTLP/gRPC.

    Decodes every exported span into a dict (``name``, ``trace_id``, ``span_id``,
    ``parent_span_id`` as hex, ``kind``, ``attributes``, ``events``, ``links``, ``status_code``,
    ``start``, ``end``, ``resource``) and every metric data point into
    ``(name, attributes, value)`` records and every log record into a dict (``event_name``,
    ``attributes``, ``trace_id``, ``span_id``, ``time``), so tests can read them back.

    Attributes:
        http_endpoint: ``http://127.0.0.1:<port>`` (the exporter appends ``/v1/traces``).
        grpc_endpoint: ``http://127.0.0.1:<port>`` (start with ``grpc=True``).
    """

    def __init__(self, grpc: bool = True):
        self.spans: list[dict] = []
        self.metrics: list[tuple[str, dict, Any]] = []
        self.logs: list[dict] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._http = _Server(("127.0.0.1", 0), _OTLPHandler)
        self._http.owner = self  # type: ignore[assignment]
        self.http_endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread: Optional[threading.Thread] = None
        self._grpc_server: Any = None
        self.grpc_endpoint: Optional[str] = None
        self._want_grpc = grpc

    def start(self) -> "OTLPReceiver":
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-http", daemon=True)
        self._thread.start()
        if self._want_grpc:
            self._start_grpc()
        return self

    def _start_grpc(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
                receiver.add_traces(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
                receiver.add_metrics(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._grpc_server = server
        self.grpc_endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._grpc_server is not None:
            self._grpc_server.stop(0)


    # -- decoding
    def add_traces(self, request: Any) -> None:
        decoded = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    decoded.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "attributes": _attributes(span.attributes),
                            "events": [{"name": e.name, "attributes": _attributes(e.attributes), "time": e.time_unix_nano} for e in span.events],
                            "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex(), "attributes": _attributes(l.attributes)} for l in span.links],
                            "status_code": span.status.code,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "resource": resource,
                            "scope": scope_spans.scope.name,
                        }
                    )
        self._add(self.spans, decoded)

    def add_logs(self, request: Any) -> None:
        decoded = []
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    decoded.append(
                        {
                            "event_name": record.event_name,
                            "attributes": _attributes(record.attributes),
                            "trace_id": record.trace_id.hex(),
                            "span_id": record.span_id.hex(),
                            "time": record.time_unix_nano,
                        }
                    )
        self._add(self.logs, decoded)

    def wait_for_logs(self, predicate: Callable[[list[dict]], bool], timeout: float = 30.0) -> list[dict]:
        """Block until ``predicate(log records)`` holds (or ``timeout`` s); returns the records."""
        return self._wait_for(self.logs, predicate, timeout)

    def add_metrics(self, request: Any) -> None:
        decoded = []
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        attrs = _attributes(point.attributes)
                        if kind == "histogram":
                            value: Any = {"count": point.count, "sum": point.sum, "bounds": list(point.explicit_bounds), "buckets": list(point.bucket_counts)}
                        else:
                            value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                        decoded.append((metric.name, attrs, value))
        self._add(self.metrics, decoded)

    def wait_for_spans(self, predicate: Callable[[list[dict]], bool], timeout: float = 30.0) -> list[dict]:
        """Block until ``predicate(spans)`` holds (or ``timeout`` s); returns the spans."""
        return self._wait_for(self.spans, predicate, timeout)

    def _wait_for(self, received: list, predicate: Callable[[list], bool], timeout: float) -> list:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(received):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return list(received)

    def _add(self, received: list, decoded: list) -> None:
        with self._changed:
            received.extend(decoded)
            self._changed.notify_all()


class _OTLPHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        import gzip

        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        owner: OTLPReceiver = self.server.owner  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        if self.path.startswith("/v1/traces"):
            request: Any = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            owner.add_traces(request)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        elif self.path.startswith("/v1/metrics"):
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(body)
            owner.add_metrics(request)
            reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        elif self.path.startswith("/v1/logs"):
            from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

            request = logs_service_pb2.ExportLogsServiceRequest()
            request.ParseFromString(body)
            owner.add_logs(request)
            reply = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
        else:
            reply = b""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class RedisServer:
    """Debian's ``redis-server`` on a free port of 127.0.0.1, without persistence, for tests and
    benchmarks of the scoring fleet. Use as a context manager; ``url`` is ``redis://...``.

    Raises:
        FileNotFoundError: ``redis-server`` is not on PATH (``make system-deps`` installs it).
        TimeoutError: it did not answer PING within 20 s.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.port = 0
        self.url = ""
        self._proc: Any = None

    def start(self) -> "RedisServer":
        """Start on a free port (on the same port again after :meth:`stop`)."""
        import shutil
        import subprocess

        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make system-deps)")
        if not self.port:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self.port = sock.getsockname()[1]
        self._proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.directory],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self._proc.poll() is not None:
                        self.stop()
                        raise TimeoutError(f"redis-server on port {self.port} did not start")
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except Exception:
                self._proc.kill()
                self._proc.wait(5)

    def restart(self) -> "RedisServer":
        """Stop and start again on the same port, empty (no persistence): what clients see
        when Redis restarts without its data."""
        self.stop()
        return self.start()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
