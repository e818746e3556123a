"""The FastAPI recipe (``examples/web_service.py``) served as in production, on 127.0.0.1:
under uvicorn, or under gunicorn with uvicorn workers (``uvicorn_worker.UvicornWorker``) and
``--preload``; stopped with SIGTERM as Kubernetes stops a pod. Shared by ``tests/test_deploy.py``
and ``benchmarks/deploy.py``.

Example::

    app = ServedApp("gunicorn", env, log=Path("app.log")).start()
    reply = app.ask("What does the pass statement do?")
    code, seconds = app.terminate(bound=45)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

#: The repository root (the example app is imported as ``examples.web_service``).
ROOT = Path(__file__).resolve().parent.parent
#: The servers :class:`ServedApp` runs.
SERVERS = ("uvicorn", "gunicorn")
#: Module names of the model host in a process's command line (the product's, the tests').
HOST_MODULES = ("relevancy_tracer.models.host", "relevancy_tracer_testing.model_host")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(server: str, port: int, workers: int = 2, graceful_timeout: float = 30.0) -> list[str]:
    """The command line of the recipe (``docs/deploying.md``), run by this Python.

    Args:
        server: ``uvicorn`` (one process) or ``gunicorn`` (a master, ``workers`` forked
            uvicorn workers, the app imported once before the fork: ``--preload``).
        graceful_timeout: gunicorn's seconds between SIGTERM to a worker and SIGKILL.
    """
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "examples.web_service:app", "--host", "127.0.0.1", "--port", str(port)]
    if server == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "examples.web_service:app", "--worker-class", "uvicorn_worker.UvicornWorker",
            "--workers", str(workers), "--preload", "--bind", f"127.0.0.1:{port}", "--graceful-timeout", f"{graceful_timeout:g}",
        ]
    raise ValueError(f"server must be one of {', '.join(SERVERS)}; got {server!r}")


class ServedApp:
    """The example web service in a subprocess; output (both streams) goes to ``log``.

    Args:
        server: see :func:`serve_command`. env: the process's environment (its settings).
        workers / graceful_timeout: gunicorn's. log: file for the server's output.
    """

    def __init__(self, server: str, env: dict, *, log: Path, workers: int = 2, graceful_timeout: float = 30.0):
        self.server = server
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(
            serve_command(server, self.port, workers, graceful_timeout), cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        """What the server printed so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def start(self, timeout: float = 180.0) -> "ServedApp":
        """Wait until the app answers ``GET /openapi.json`` (after its lifespan startup).
        Raises RuntimeError (with the output) when it exits or does not answer in ``timeout`` s."""
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.server} exited with status {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/openapi.json", timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.terminate(bound=30)
                raise RuntimeError(f"{self.server} did not answer within {timeout:g} s:\n{self.output()[-4000:]}")
            pause.wait(0.2)

    def ask(self, question: str, timeout: float = 120.0) -> dict:
        """``POST /ask`` with ``question``; the decoded reply (``answer``, ``topics``)."""
        request = urllib.request.Request(self.url + "/ask", data=json.dumps({"question": question}).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def processes(self) -> dict[str, Any]:
        """The running processes (psutil): ``master``, ``workers`` (gunicorn's; the master
        itself under uvicorn) and ``hosts`` (model hosts started by them)."""
        import psutil

        master = psutil.Process(self.proc.pid)
        descendants = master.children(recursive=True)
        hosts = [p for p in descendants if _is_host(p)]
        workers = [p for p in master.children() if p not in hosts] if self.server == "gunicorn" else [master]
        return {"master": master, "workers": workers, "hosts": hosts}

    def terminate(self, bound: float = 60.0) -> tuple[Optional[int], float]:
        """SIGTERM, as Kubernetes sends it; (exit status, seconds to exit). The process is
        killed (status None) when it has not exited within ``bound`` seconds."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(bound)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                self._log_file.close()
                return None, time.monotonic() - started
        self._log_file.close()
        return self.proc.returncode, time.monotonic() - started


def _is_host(process: Any) -> bool:
    try:
        cmdline = process.cmdline()
    except Exception:  # psutil.Error: gone meanwhile
        return False
    return any(module in cmdline for module in HOST_MODULES)


def host_info(settings: Any, cache_dir: Path) -> dict:
    """``GET /info`` of the model host of ``settings`` (a Settings) under ``cache_dir``: its
    ``pid``, ``clients`` (processes connected to it), ... Read over its socket without becoming
    one of its clients (nothing starts). Raises OSError when no such host runs."""
    import http.client

    from relevancy_tracer.models.host import HostPaths
    from relevancy_tracer.scoring.backends import host_spec

    path = HostPaths.of(host_spec(settings), cache_dir / "hosts").socket

    class Connection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10.0)
            self.sock.connect(str(path))

    connection = Connection("model-host")
    try:
        connection.request("GET", "/info")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def memory(process: Any) -> dict[str, int]:
    """``rss``, ``uss`` and ``pss`` bytes of a psutil process (``memory_full_info``): USS is
    what the process alone holds (freed when it exits), PSS its share of pages it shares."""
    info = process.memory_full_info()
    return {"rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", 0)}


def app_environment(cache_dir: Optional[Path] = None, **settings: str) -> dict[str, str]:
    """The example's environment: this process's without ``OTEL_*``/``RELEVANCY_TRACER_*``
    settings (the cache directory kept unless ``cache_dir`` is given), this checkout first on
    the import path, answers from passage sentences (``EXAMPLE_GENERATOR=extractive``: no LLM
    in the request path), plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELEVANCY_TRACER_", "OTEL_", "OPENAI_", "PHOENIX_")) or k == "RELEVANCY_TRACER_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env["EXAMPLE_GENERATOR"] = "extractive"
    if cache_dir is not None:
        env["RELEVANCY_TRACER_CACHE_DIR"] = str(cache_dir)
    env.update(settings)
    return env
