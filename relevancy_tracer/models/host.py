"""One embedded model host per (user, model set) on a machine.

The embedded models (llama.cpp chat model with its continuous-batching decoder, the local
embedder) run in a separate *model host* process, never in the app's address space:

* a native crash or the OOM killer in the scorer kills the host, not the app; the in-flight
  requests fail with :class:`ModelHostError` (evaluation status ``model_host_crashed``) and the
  next request restarts the host, with backoff, a bounded number of times;
* every process of the user that needs the same models (forked app workers, the CLI, ``serve``,
  fleet workers on the machine) connects to the one running host: one llama.cpp context and
  one thread pool on the machine, whose decoder batches requests of all its clients together;
* the host runs at a lower CPU priority than the app: ``nice`` (default 19) and, with nice 19,
  Linux's ``SCHED_IDLE`` policy, so a waking app thread preempts its threads at once (see
  :func:`lower_priority`).

Protocol: JSON over HTTP on a Unix domain socket (aiohttp's :class:`~aiohttp.web.UnixSite`),
forwarding exactly the two protocol calls (``POST /chat`` = ``ChatModel.chat_json``,
``POST /embed`` = ``Embedder.embed``) and ``POST /generate`` (``LocalChatModel.generate``).
The OpenAI API cannot express what the local chat model does with a call (the judge's digit
distribution ``score_probs`` for ``score_key``, the forced JSON prefix and reply limits, which
read the messages), so forwarding the calls themselves is what keeps the scores the same.

Files, in ``<cache dir>/hosts`` (mode 0700): ``<key>.sock`` (the HTTP socket, 0600),
``<key>.clients`` (presence socket, 0600), ``<key>.lock`` (start lock), ``<key>.log`` (the
host's stderr, faulthandler tracebacks of native crashes included). ``<key>`` is a hash of the
model set.

Lifetime: each client process holds one connection to the presence socket. The kernel closes it
when the process ends, however it ends (SIGKILL included), so the host knows its clients; it
exits ``idle_timeout`` seconds after the last one has gone. Two processes starting a host at
once serialise on ``flock`` of the lock file: the second finds the first's host running.

Run the host by hand: ``python -m relevancy_tracer.models.host --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .._background import fork as _fork
from .base import ChatReply, EmbeddingReply, ModelError

logger = logging.getLogger("relevancy_tracer")

#: Bumped when the wire format changes; part of the host key, so old and new never mix.
PROTOCOL = 1
#: Host crashes one client tolerates within :data:`RESTART_WINDOW` seconds before it stops
#: restarting the host and fails every request with a clear status.
MAX_RESTARTS = 5
RESTART_WINDOW = 600.0
#: Seconds a client waits for a starting host to accept connections (the model loads lazily).
START_TIMEOUT = 60.0
#: The module a client runs (``python -m``) to start a host.
HOST_MODULE = "relevancy_tracer.models.host"

#: Models a host may serve besides the local ones: name -> factory returning a ChatModel or an
#: Embedder, and the module whose ``main`` starts such a host (it registers the same names).
#: Empty in the product. Only code running in this process fills it (:func:`serve_extra_models`:
#: the test suite's scripted models, ``relevancy_tracer_testing.use_scripted_host_models``);
#: no setting or environment variable reaches it, and no model name is ever imported.
_extra_models: dict[str, Callable[[], Any]] = {}
_host_module = [HOST_MODULE]


def serve_extra_models(factories: Mapping[str, Callable[[], Any]], host_module: str) -> None:
    """Let the model hosts of this process serve ``factories`` under their names (``llm_model``
    / ``embedding_model`` may then name them), starting hosts with ``python -m host_module``,
    whose ``main`` must make the same call before :func:`main`. For tests and benchmarks
    (scripted models in place of llama.cpp); a user's settings cannot reach it."""
    _extra_models.update(factories)
    _host_module[0] = host_module


def check_model_name(setting: str, name: Optional[str]) -> None:
    """Refuse a model name the host would not serve as a model: a ``module:function`` (a
    colon, and no such file), which earlier versions imported and called in the host. Names
    given to :func:`serve_extra_models` pass.

    Raises:
        ValueError: naming ``setting`` (``llm_model`` / ``embedding_model``) and the choices.
    """
    if not name or name in _extra_models or ":" not in name or os.path.exists(name):
        return
    from .local_embed import LOCAL_EMBEDDERS
    from .local_llm import LOCAL_MODELS

    choices = f"one of {', '.join(LOCAL_MODELS)} or a path to a GGUF file" if setting == "llm_model" else f"one of {', '.join(LOCAL_EMBEDDERS)}"
    raise ValueError(f"{setting} {name!r} is not a local model: use {choices} (a module:function is never imported)")


class ModelHostError(ModelError):
    """The model host died while a request was in flight, or cannot be (re)started.

    ``status`` is the evaluation status it becomes (``model_host_crashed``).
    """

    status = "model_host_crashed"


# ----------------------------------------------------------------------------- the model set


@dataclass(frozen=True)
class HostSpec:
    """The models one host serves, and how it runs.

    Attributes:
        llm: local chat model (name in ``LOCAL_MODELS`` or GGUF path) or None.
        threads: llama.cpp threads (None: the host's CPUs, see ``default_threads``).
        n_ctx: KV cache tokens. repack: ``auto | on | off``.
        embedder: local embedder name (``LOCAL_EMBEDDERS``) or None. A client refuses to
            start a host for a ``module:function`` (:meth:`check`).
        nice: CPU niceness added to the host (0-19). idle_timeout: seconds the host lives on
            after its last client has gone.
        sched_idle: also run the host under the ``SCHED_IDLE`` scheduling policy where the OS
            allows it (:func:`lower_priority`); :func:`~relevancy_tracer.models.host_spec`
            sets it for ``local_host_nice`` 19, the lowest priority.
    """

    llm: Optional[str] = None
    threads: Optional[int] = None
    n_ctx: int = 8192
    repack: str = "auto"
    embedder: Optional[str] = None
    nice: int = 19
    idle_timeout: float = 60.0
    sched_idle: bool = True

    def check(self) -> None:
        """Raise ValueError when a model name is one no host serves (:func:`check_model_name`)."""
        check_model_name("llm_model", self.llm)
        check_model_name("embedding_model", self.embedder)

    @property
    def key(self) -> str:
        """16 hex digits naming this model set (and the protocol version)."""
        ident = json.dumps([PROTOCOL, self.llm, self.threads, self.n_ctx, self.repack, self.embedder, self.nice, self.sched_idle], sort_keys=True)
        return hashlib.sha256(ident.encode()).hexdigest()[:16]

    def argv(self) -> list[str]:
        args = ["--n-ctx", str(self.n_ctx), "--repack", self.repack, "--nice", str(self.nice), "--idle-timeout", f"{self.idle_timeout:g}"]
        if self.sched_idle:
            args.append("--sched-idle")
        if self.llm:
            args += ["--llm", self.llm]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.embedder:
            args += ["--embedder", self.embedder]
        return args


def hosts_dir() -> Path:
    """``<cache dir>/hosts``, created private to the user (0700). Raises ModelHostError when it
    is not a directory owned by this user."""
    from .local_llm import cache_dir

    path = cache_dir() / "hosts"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
        if info.st_uid != os.getuid():
            raise ModelHostError(f"{path} belongs to another user")
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise ModelHostError(f"cannot create the model host directory {path}: {exc}") from exc
    return path


@dataclass(frozen=True)
class HostPaths:
    socket: Path
    clients: Path
    lock: Path
    log: Path

    @classmethod
    def of(cls, spec: HostSpec, directory: Optional[Path] = None) -> "HostPaths":
        base = (directory or hosts_dir()) / spec.key
        return cls(Path(f"{base}.sock"), Path(f"{base}.clients"), Path(f"{base}.lock"), Path(f"{base}.log"))


def _last_line(path: Path) -> str:
    """The last non-empty line of a host's log (its error, when it failed to start)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = [line.strip() for line in handle.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"


def describe_exit(code: Optional[int]) -> str:
    """``killed by SIGKILL`` / ``exited with status 3`` for a Popen return code."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# ----------------------------------------------------------------------------- the client


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
                        [sys.executable, "-X", "faulthandler", "-m", _host_module[0], "--directory", str(paths.socket.parent), *self.spec.argv()],
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

    if model in LOCAL_MODELS or model in _extra_models:
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
        self.decoding = "" if model in _extra_models else DECODING

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


# ----------------------------------------------------------------------------- the host


class _Host:
    def __init__(self, spec: HostSpec, paths: HostPaths):
        self.spec = spec
        self.paths = paths
        self.llm: Any = None
        self.embedder: Any = None
        self.threads = 0
        self.clients = 0
        self.connected = False
        self.in_flight = 0
        self.served = 0
        self.idle_since = time.monotonic()

    def build(self) -> None:
        from .local_llm import default_threads

        spec = self.spec
        self.threads = spec.threads or default_threads()
        if spec.llm:
            factory = _extra_models.get(spec.llm)
            if factory is not None:
                self.llm = factory()
            else:
                from .local_llm import LocalChatModel

                self.llm = LocalChatModel(spec.llm, threads=self.threads, n_ctx=spec.n_ctx, repack=spec.repack)
        if spec.embedder:
            factory = _extra_models.get(spec.embedder)
            if factory is not None:
                self.embedder = factory()
            else:
                from .local_embed import make_local_embedder

                self.embedder = make_local_embedder(spec.embedder)

    # -- handlers

    async def _serve(self, request: Any, work: Any) -> Any:
        from aiohttp import web

        self.in_flight += 1
        try:
            payload = await request.json()
            return web.json_response(await work(payload))
        except ModelError as exc:
            return web.json_response({"error": str(exc)}, status=502)
        except Exception as exc:  # a bug or a bad request: the client gets a ModelError
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        finally:
            self.in_flight -= 1
            self.served += 1

    async def chat(self, request: Any) -> Any:
        async def work(p: dict) -> dict:
            if self.llm is None:
                raise ModelError("this model host serves no chat model")
            reply = await self.llm.chat_json(
                p["messages"], p["schema"], max_tokens=int(p["max_tokens"]), temperature=float(p.get("temperature") or 0.0),
                seed=p.get("seed"), score_key=p.get("score_key"),
            )
            data = asdict(reply)
            if reply.score_probs is not None:
                data["score_probs"] = {str(k): v for k, v in reply.score_probs.items()}
            return data

        return await self._serve(request, work)

    async def generate(self, request: Any) -> Any:
        async def work(p: dict) -> dict:
            if self.llm is None or not hasattr(self.llm, "generate"):
                raise ModelError("this model host's chat model cannot generate free text")
            text = await asyncio.to_thread(self.llm.generate, p["messages"], max_tokens=int(p.get("max_tokens", 256)), temperature=float(p.get("temperature") or 0.0))
            return {"text": text}

        return await self._serve(request, work)

    async def embed(self, request: Any) -> Any:
        async def work(p: dict) -> dict:
            if self.embedder is None:
                raise ModelError("this model host serves no embedder")
            reply = await self.embedder.embed(p["texts"])
            vectors = np.ascontiguousarray(reply.vectors, dtype=np.float32)
            return {"vectors": base64.b64encode(vectors.tobytes()).decode("ascii"), "shape": list(vectors.shape), "input_tokens": reply.input_tokens, "model": reply.model}

        return await self._serve(request, work)

    async def info(self, request: Any) -> Any:
        from aiohttp import web

        stats = getattr(self.llm, "stats", None)
        return web.json_response({
            "pid": os.getpid(), "protocol": PROTOCOL, "llm": getattr(self.llm, "name", None), "embedder": getattr(self.embedder, "name", None),
            "clients": self.clients, "in_flight": self.in_flight, "served": self.served, "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "policy": scheduling_policy(),
            "threads": self.threads, "decode_stats": asdict(stats) if stats is not None else None,
        })

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients += 1
        self.connected = True
        try:
            while await reader.read(4096):
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self.clients -= 1
            if self.clients == 0:
                self.idle_since = time.monotonic()
            writer.close()

    # -- main

    async def run(self) -> None:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        # every in-flight call waits in a thread (LocalChatModel.chat_json); the decoder batches them
        loop.set_default_executor(ThreadPoolExecutor(max_workers=64, thread_name_prefix="relevancy-host"))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/chat", self.chat)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/embed", self.embed)
        app.router.add_get("/info", self.info)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        old_umask = os.umask(0o177)  # sockets 0600
        try:
            site = web.UnixSite(runner, str(self.paths.socket))
            await site.start()
            presence = await asyncio.start_unix_server(self.client, path=str(self.paths.clients))
        finally:
            os.umask(old_umask)
        bound = {path: path.stat().st_ino for path in (self.paths.socket, self.paths.clients)}
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        warm = getattr(self.llm, "count_tokens", None)
        if warm is not None:  # load the weights now, not in the first request
            loop.run_in_executor(None, warm, "")
        try:
            while not stop.is_set():
                # before its first client has connected, the host waits as long as a starting
                # client does (a loaded machine may take seconds to schedule that client)
                timeout = self.spec.idle_timeout if self.connected else max(self.spec.idle_timeout, START_TIMEOUT)
                if self.clients == 0 and self.in_flight == 0 and time.monotonic() - self.idle_since > timeout:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)
        finally:
            presence.close()
            for path, inode in bound.items():  # not a successor's sockets at the same paths
                with contextlib.suppress(OSError):
                    if path.stat().st_ino == inode:
                        path.unlink()
            await runner.cleanup()
        close = getattr(self.llm, "close", None)
        if close is not None:
            await asyncio.to_thread(close, 5.0)


def lower_priority(nice: int, sched_idle: bool = False) -> str:
    """Lower this process's CPU priority; call before starting threads (later threads, llama.cpp's
    and the executor's, inherit it). Returns the scheduling policy in effect (``SCHED_IDLE`` or
    ``SCHED_OTHER``).

    Three steps, because the host runs in a session of its own:

    * ``nice(2)`` by ``nice`` (0-19);
    * where the kernel groups processes by session for scheduling (``CONFIG_SCHED_AUTOGROUP``,
      ``/proc/sys/kernel/sched_autogroup_enabled`` = 1, the default of most desktop and many
      server kernels), the nice value of the session's autogroup (``/proc/self/autogroup``,
      sched(7)): there a process's nice value only ranks it within its session, and the host's
      session would get an equal share of the CPU with the app's;
    * with ``sched_idle``, Linux's ``SCHED_IDLE`` policy (sched(7), ``sched_setscheduler(2)``;
      permitted without privileges): its threads run only when no normal thread wants the CPU,
      and a normal thread waking up preempts them at once. Nice values bound a low-priority
      task's *share* of the CPU, not the delay before a waking app thread runs, which is what
      an app's tail latency sees.

    On Linux nice values and policies belong to threads: the threads started before this call
    (OpenBLAS starts its pool when numpy is imported) are lowered one by one
    (``/proc/self/task``). Failures (no permission, no autogroup, no ``SCHED_IDLE`` on this OS)
    are ignored: the steps that worked stay in effect.
    """
    try:
        lowered = os.nice(nice)
    except OSError as exc:
        if exc.errno != errno.EPERM:
            raise
        lowered = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        others = [int(task) for task in os.listdir("/proc/self/task") if int(task) != threading.get_native_id()]
    except OSError:  # not Linux: one process-wide value
        others = []
    for tid in others:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, lowered)
    try:
        with open("/proc/self/autogroup", "w") as handle:
            handle.write(str(nice))
    except OSError:
        pass
    if sched_idle and hasattr(os, "SCHED_IDLE"):
        try:
            for tid in [0, *others]:
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:  # e.g. a seccomp profile refusing sched_setscheduler
            logger.warning("relevancy-tracer: the model host keeps SCHED_OTHER (SCHED_IDLE refused: %s)", exc)
    return scheduling_policy()


def scheduling_policy(pid: int = 0) -> str:
    """``SCHED_IDLE``, ``SCHED_OTHER``, ... of process (thread) ``pid`` (0: this thread)."""
    if not hasattr(os, "sched_getscheduler"):
        return "SCHED_OTHER"
    policy = os.sched_getscheduler(pid)
    names = {getattr(os, name): name for name in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR") if hasattr(os, name)}
    return names.get(policy, str(policy))


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m relevancy_tracer.models.host``: run one model host in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m relevancy_tracer.models.host", description="Serve the embedded models on a Unix socket.")
    parser.add_argument("--directory", help="socket directory (default: <cache dir>/hosts)")
    parser.add_argument("--llm")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--repack", default="auto")
    parser.add_argument("--embedder")
    parser.add_argument("--nice", type=int, default=19)
    parser.add_argument("--idle-timeout", type=float, default=60.0)
    parser.add_argument("--sched-idle", action="store_true", help="run under SCHED_IDLE where the OS allows it")
    args = parser.parse_args(argv)
    spec = HostSpec(args.llm, args.threads, args.n_ctx, args.repack, args.embedder, args.nice, args.idle_timeout, args.sched_idle)
    try:
        spec.check()
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s model-host[%(process)d] %(message)s")
    if spec.nice or spec.sched_idle:
        lower_priority(spec.nice, spec.sched_idle)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    paths = HostPaths.of(spec, Path(args.directory) if args.directory else None)
    host = _Host(spec, paths)
    host.build()
    logging.getLogger("relevancy_tracer").info("serving %s / %s on %s", spec.llm, spec.embedder, paths.socket)
    asyncio.run(host.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
