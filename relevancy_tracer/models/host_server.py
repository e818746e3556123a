"""The model host process: serves the embedded models of one :class:`~relevancy_tracer.models.host_spec.HostSpec`
on a Unix socket (aiohttp), counts its clients on the presence socket, exits after the last has
gone, and runs at a lower CPU priority (:func:`lower_priority`). Run it by hand with
``python -m relevancy_tracer.models.host --help``. The overview, protocol and files are in
:mod:`relevancy_tracer.models.host`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from . import host_spec as _spec
from .base import ModelError
from .host_spec import PROTOCOL, START_TIMEOUT, HostPaths, HostSpec

logger = logging.getLogger("relevancy_tracer")


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
            factory = _spec._extra_models.get(spec.llm)
            if factory is not None:
                self.llm = factory()
            else:
                from .local_llm import LocalChatModel

                self.llm = LocalChatModel(spec.llm, threads=self.threads, n_ctx=spec.n_ctx, repack=spec.repack)
        if spec.embedder:
            factory = _spec._extra_models.get(spec.embedder)
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
