"""The model host's client: :class:`HostConnection` (this process's link to the host: starts
it, restarts it after a crash, sends requests over its Unix socket) and the backends that run
their calls in the host, :class:`HostChatModel` and :class:`HostEmbedder`. The overview,
protocol and files are in :mod:`relevancy_tracer.models.host`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import fcntl
import http.client
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .._background import fork as _fork
from . import host_spec as _spec
from .base import ChatReply, EmbeddingReply, ModelError
from .host_spec import START_TIMEOUT, HostPaths, HostSpec, ModelHostError, _last_line, describe_exit

logger = logging.getLogger("relevancy_tracer")

#: Host crashes one client tolerates within :data:`RESTART_WINDOW` seconds before it stops
#: restarting the host and fails every request with a clear status.
MAX_RESTARTS = 5
RESTART_WINDOW = 600.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("model-host", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _Call:
    """One request's connection, so that a cancelled caller can close it."""

    def __init__(self) -> None:
        self.connection: Optional[_UnixHTTPConnection] = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        sock = self.connection.sock if self.connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _ended(sock: socket.socket, timeout: float) -> bool:
    """True when ``sock`` (a presence connection, on which the host never writes) becomes
    readable, i.e. reaches end-of-file, within ``timeout`` seconds. poll(2), not select(2):
    an app may hold more than FD_SETSIZE (1024) descriptors."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(int(timeout * 1000)))
    except (OSError, ValueError):  # closed meanwhile
        return True


class _NotStarted(Exception):
    """The host was not running when the request was sent (nothing in flight was lost)."""


class HostConnection:
    """This process's link to the model host of ``spec``: starts the host on first use,
    restarts it after a crash (bounded), and sends requests.

    Blocking requests use :mod:`http.client` over the Unix socket (one connection per request,
    from any thread); :meth:`arequest` runs one in a worker thread and, when cancelled, closes
    its connection so the host stops that request. Safe across ``os.fork``: the child
    reconnects (it never inherits the parent's presence connection or child process).
    """

    def __init__(self, spec: HostSpec, directory: Optional[Path] = None, *, max_restarts: int = MAX_RESTARTS, restart_window: float = RESTART_WINDOW):
        self.spec = spec
        self._directory = directory
        self._paths: Optional[HostPaths] = None
        self._max_restarts = max_restarts
        self._restart_window = restart_window
        self._presence: Optional[socket.socket] = None
        self._process: Optional[subprocess.Popen] = None
        self._host_pid: Optional[int] = None
        self._crashes: collections.deque[float] = collections.deque()
        self._generation = 0  # +1 per presence connection: one host as this process saw it
        self._lost = -1
        self._lost_reason = "the model host exited"
        self._lock = threading.Lock()
        #: Host starts made by this process (tests and benchmarks read it).
        self.starts = 0
        #: Why no host is started for ``spec`` (a model name no host serves), or None.
        self.refused: Optional[str] = None
        try:
            spec.check()
        except ValueError as exc:
            self.refused = str(exc)
            logger.warning("relevancy-tracer: %s; every local evaluation fails with this error", exc)
        _fork.renew_after_fork(self, HostConnection._renew_after_fork)

    def _renew_after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._presence is not None:
            with contextlib.suppress(OSError):
                self._presence.close()  # the parent's connection stays open in the parent
        self._presence = None
        self._process = None  # not this child's child
        self._crashes = collections.deque()
        self.starts = 0

    @property
    def paths(self) -> HostPaths:
        if self._paths is None:
            self._paths = HostPaths.of(self.spec, self._directory)
        return self._paths

    # -- host lifetime

    def _alive(self) -> bool:
        """True while the presence connection is open. The host never writes on it: readable
        means end-of-file, the host has died (recorded as a crash). Call with the lock held."""
        presence = self._presence
        if presence is None:
            return False
        if _ended(presence, 0):
            self._lose(self._generation)
            return False
        return True

    def _connect_presence(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.paths.clients))
        except OSError:
            sock.close()
            return False
        self._presence = sock
        self._generation += 1
        return True

    def _death(self) -> str:
        """How the host this process last used ended (its exit status when this process
        started it; the log file otherwise)."""
        process = self._process
        if process is not None:
            try:
                code = process.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
            self._process = None
            return f"the model host (pid {process.pid}) {describe_exit(code)}"
        pid = f" (pid {self._host_pid})" if self._host_pid else ""
        return f"the model host{pid} exited (see {self.paths.log})"

    def host_lost(self, generation: int) -> Optional[str]:
        """A request to the host of ``generation`` (see :meth:`attach`) broke: when the host
        has died (its presence connection reaches end-of-file within a second), record it once
        however many requests saw it and return the reason; None when the host lives."""
        with self._lock:
            presence = self._presence
            if generation == self._generation and presence is not None:
                if not _ended(presence, 1.0):
                    return None
            return self._lose(generation)

    def _lose(self, generation: int) -> str:
        if generation != self._generation or self._lost == generation:
            return self._lost_reason
        if self._presence is not None:
            with contextlib.suppress(OSError):
                self._presence.close()
            self._presence = None
        self._lost, self._lost_reason = generation, self._death()
        self._crashes.append(time.monotonic())
        logger.warning("relevancy-tracer: %s", self._lost_reason)
        return self._lost_reason

    def attach(self) -> int:
        """Make sure the host runs and this process is one of its clients: connect to it, or
        start it (under the lock file), after a backoff when it crashed recently. Blocking.

        Returns the host's generation (for :meth:`host_lost`). Raises ModelHostError when the
        host cannot be started or crashed :data:`MAX_RESTARTS` times within
        :data:`RESTART_WINDOW` seconds, ModelError when a model name is refused
        (:attr:`refused`: no host is started).
        """
        if self.refused is not None:
            raise ModelError(self.refused)
        with self._lock:
            if self._alive():
                return self._generation
            now = time.monotonic()
            while self._crashes and now - self._crashes[0] > self._restart_window:
                self._crashes.popleft()
            recent = len(self._crashes)
            if recent >= self._max_restarts:
                raise ModelHostError(
                    f"the model host crashed {recent} times within {self._restart_window:g} s; not restarting it "
                    f"(last: {self._lost_reason}; log: {self.paths.log})"
                )
            if self._connect_presence():
                return self._generation
            if recent:  # backoff: 0.25 s after one crash, doubling, at most 30 s
                wait = min(30.0, 0.25 * 2 ** (recent - 1)) - (now - self._crashes[-1])
                if wait > 0:
                    time.sleep(wait)
            self._start_locked()
            return self._generation

    def _start_locked(self) -> None:
        paths = self.paths
        with open(paths.lock, "a+") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if self._connect_presence():  # another process started it meanwhile
                    return
                for stale in (paths.socket, paths.clients):
                    with contextlib.suppress(FileNotFoundError):
                        stale.unlink()
                log = open(paths.log, "ab")
                try:
                    if log.tell() > 4 << 20:
                        log.truncate(0)
                    env = dict(os.environ)
                    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                    process = subprocess.Popen(
                        [sys.executable, "-X", "faulthandler", "-m", _spec._host_module[0], "--directory", str(paths.socket.parent), *self.spec.argv()],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        env=env,
                        start_new_session=True,  # not in the app's process group: no terminal signals
                    )
                finally:
                    log.close()
                self.starts += 1
                deadline = time.monotonic() + START_TIMEOUT
                while not self._connect_presence():
                    code = process.poll()
                    if code is not None:
                        raise ModelHostError(f"the model host {describe_exit(code)} while starting ({_last_line(paths.log)}); log: {paths.log}")
                    if time.monotonic() > deadline:
                        process.kill()
                        process.wait()
                        raise ModelHostError(f"the model host did not start within {START_TIMEOUT:g} s; log: {paths.log}")
                    time.sleep(0.02)
                self._process = process
                self._host_pid = process.pid
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def close(self) -> None:
        """Leave the host (it exits after its idle timeout when no client is left)."""
        with self._lock:
            if self._presence is not None:
                with contextlib.suppress(OSError):
                    self._presence.close()
                self._presence = None

    # -- requests

    def _send(self, path: str, payload: Any, generation: int, call: Optional["_Call"] = None) -> Any:
        connection = _UnixHTTPConnection(str(self.paths.socket), timeout=None)
        if call is not None:
            call.connection = connection
        body = json.dumps(payload).encode("utf-8")
        try:
            try:
                connection.connect()
            except OSError as exc:
                raise _NotStarted(str(exc)) from exc
            # A caller cancelled before the socket existed (e.g. while the host was starting)
            # had nothing to shut down: stop here rather than send a request nobody waits for.
            # cancel() sets the flag before reading the socket, this reads it after connecting:
            # one of the two sees the other.
            if call is not None and call.cancelled:
                raise ModelError("cancelled")
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                if call is not None and call.cancelled:
                    raise ModelError("cancelled") from exc
                reason = self.host_lost(generation)
                if reason is None:  # the host lives: only this connection broke
                    raise ModelError(f"the model host dropped the connection ({type(exc).__name__}: {exc})") from exc
                raise ModelHostError(f"{reason} while this request was in flight ({type(exc).__name__})") from exc
        finally:
            connection.close()
        try:
            reply = json.loads(data)
        except ValueError as exc:
            raise ModelError(f"the model host sent an unreadable reply (HTTP {response.status})") from exc
        if response.status != 200:
            raise ModelError(str(reply.get("error") or f"HTTP {response.status}"))
        return reply

    def request(self, path: str, payload: Any, call: Optional["_Call"] = None) -> Any:
        """POST ``payload`` (JSON) to ``path`` on the host; the decoded JSON reply. Blocking.

        Raises ModelHostError (host died in flight, cannot start) or ModelError (the model
        failed; the host's message).
        """
        for _ in range(3):
            if call is not None and call.cancelled:
                raise ModelError("cancelled")
            generation = self.attach()
            try:
                return self._send(path, payload, generation, call)
            except _NotStarted:
                # the host went away before this request reached it: nothing was in flight
                with self._lock:
                    self._alive()
        raise ModelHostError(f"cannot reach the model host at {self.paths.socket}")

    async def arequest(self, path: str, payload: Any) -> Any:
        """:meth:`request` in a worker thread; on cancellation its connection is closed, which
        cancels the request in the host."""
        call = _Call()
        try:
            return await asyncio.to_thread(self.request, path, payload, call)
        except asyncio.CancelledError:
            call.cancel()
            raise

    def info(self) -> dict:
        """The host's ``GET /info``: pid, model names, clients, requests in flight. Blocking."""
        self.attach()
        connection = _UnixHTTPConnection(str(self.paths.socket), timeout=10.0)
        try:
            connection.request("GET", "/info")
            return json.loads(connection.getresponse().read())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ModelHostError(f"cannot read the model host's info: {exc}") from exc
        finally:
            connection.close()


def _local_name(model: str) -> str:
    """The name LocalChatModel reports for ``model`` (an extra model keeps its name)."""
    from .local_llm import LOCAL_MODELS

    if model in LOCAL_MODELS or model in _spec._extra_models:
        return model
    return Path(model).name


class HostChatModel:
    """A :class:`~relevancy_tracer.models.base.ChatModel` whose calls run in the model host.

    ``name`` and ``decoding`` are those of the local model in the host (the evaluator version
    and the calibration are the same as in-process). Raises ModelError / ModelHostError.
    """

    def __init__(self, connection: HostConnection):
        from .local_llm import DECODING

        self.connection = connection
        model = connection.spec.llm or ""
        self.name = _local_name(model)
        self.decoding = "" if model in _spec._extra_models else DECODING

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
        payload = {"messages": list(messages), "schema": schema, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "score_key": score_key}
        return _chat_reply(await self.connection.arequest("/chat", payload))

    def generate(self, messages: Sequence[dict], *, max_tokens: int = 256, temperature: float = 0.0) -> str:
        """Free-text completion by the host's model (``LocalChatModel.generate``), blocking."""
        reply = self.connection.request("/generate", {"messages": list(messages), "max_tokens": max_tokens, "temperature": temperature})
        return str(reply["text"])


class HostEmbedder:
    """An :class:`~relevancy_tracer.models.base.Embedder` whose calls run in the model host."""

    def __init__(self, connection: HostConnection):
        self.connection = connection
        self.name = connection.spec.embedder or ""

    async def embed(self, texts: Sequence[str]) -> EmbeddingReply:
        return _embedding_reply(await self.connection.arequest("/embed", {"texts": list(texts)}))

    def embed_sync(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 vectors of ``texts``, blocking (as the local embedders' ``embed_sync``)."""
        return _embedding_reply(self.connection.request("/embed", {"texts": list(texts)})).vectors


def _chat_reply(data: dict) -> ChatReply:
    probs = data.get("score_probs")
    if probs is not None:
        probs = {int(k): float(v) for k, v in probs.items()}
    return ChatReply(
        text=data["text"], input_tokens=data.get("input_tokens", 0), output_tokens=data.get("output_tokens", 0),
        model=data.get("model", ""), finish_reason=data.get("finish_reason"), score_probs=probs,
    )


def _embedding_reply(data: dict) -> EmbeddingReply:
    vectors = np.frombuffer(base64.b64decode(data["vectors"]), dtype=np.float32).reshape(data["shape"])
    return EmbeddingReply(vectors=vectors.copy(), input_tokens=data.get("input_tokens", 0), model=data.get("model", ""))
