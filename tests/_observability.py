"""Helpers of the observability tests: free ports, polling with a deadline, server processes,
the traced app subprocess and an embedder that sets the relevancy score."""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import pytest

from .conftest import ROOT, subprocess_env

APP_SCRIPT = ROOT / "tests" / "traced_app.py"
COLLECTOR_CONFIG = ROOT / "collector-config"

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(probe: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.25) -> T:
    """Call ``probe()`` every ``interval`` s until it returns a truthy value, which is returned.

    Fails the test after ``timeout`` seconds, naming ``what`` and the last exception raised.
    """
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    pause = threading.Event()
    while True:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # servers still starting, etc.
            last_error = exc
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}" + (f" (last error: {last_error!r})" if last_error else ""))
        pause.wait(interval)


def http_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def http_ok(url: str) -> bool:
    """True when GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def binary(*names: str) -> str:
    """The path of the first of ``names`` on PATH; fails the test when none is installed.

    ``make test`` installs them (``bash .ci/system-deps``), so a missing binary is an error,
    not a reason to skip."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {', '.join(names)} is on PATH: run `make system-deps` (bash .ci/system-deps)")


class ServerProcess:
    """A server subprocess whose output goes to ``log``; stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, cmd: list[str], log: Path, env: Optional[dict] = None):
        self.cmd = cmd
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)

    def tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_running(self) -> None:
        """Fail the test (with the log) when the process has exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"{Path(self.cmd[0]).name} exited with status {self.proc.returncode}:\n{self.tail()}")

    def stop(self, timeout: float = 10.0) -> int:
        """Terminate the process and return its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._log_file.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def app_env(**overrides: str) -> dict:
    """The environment of an app subprocess: this process's, without OTEL_* and
    RELEVANCY_TRACER_* settings, importing relevancy_tracer from this checkout."""
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env["RELEVANCY_TRACER_METHOD"] = "ragas"  # ScoreDial sets the ragas (cosine) score exactly
    env.update(overrides)
    return env


class TracedApp:
    """``tests/traced_app.py`` in a subprocess; ``start()`` returns once it printed ``ready``.

    Args:
        base_url: the OpenAI-compatible server's base URL.
        env: extra environment (OTEL_* settings).
        calls: calls to make then exit; 0 runs at ``rate`` calls/s until :meth:`stop`.
    """

    def __init__(self, base_url: str, env: dict, calls: int = 0, rate: float = 5.0):
        cmd = [sys.executable, str(APP_SCRIPT), "--base-url", base_url, "--rate", str(rate)]
        if calls:
            cmd += ["--calls", str(calls)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=app_env(**env), text=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        """The first output line starting with ``prefix``; fails on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"app printed no {prefix!r} line in {timeout:.0f} s:\n{''.join(self.output)[-3000:]}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5)
                pytest.fail(f"app exited ({self.proc.returncode}) before printing {prefix!r}:\n{''.join(self.output)[-3000:]}")
            if line.startswith(prefix):
                return line

    def start(self, timeout: float = 60.0) -> "TracedApp":
        """Wait for ``ready``; on failure the process is stopped before the test fails."""
        try:
            self.wait_for_line("ready", timeout)
        except BaseException:
            self.stop(timeout=5.0)
            raise
        return self

    def stop(self, timeout: float = 30.0) -> int:
        """Close the app's stdin (it then shuts the tracer down) and wait for its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)
        return self.proc.returncode

    def __enter__(self) -> "TracedApp":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ScoreDial:
    """An embedder for :class:`~relevancy_tracer_testing.FakeOpenAIServer` that sets every
    ``ragas`` score to :attr:`value` (in [0, 1], a cosine similarity, dimensionless).

    The question embeds to e1 and every other text (the generated questions) to
    value·e1 + sqrt(1 - value²)·e2, so each similarity, and their mean, equals ``value``
    (to float32 precision). Change :attr:`value` while the app runs to move its scores.
    """

    def __init__(self, question: str, value: float):
        self.question = question
        self.value = value

    def __call__(self, text: str) -> list[float]:
        if text == self.question:
            return [1.0, 0.0]
        value = self.value
        return [value, math.sqrt(max(0.0, 1.0 - value * value))]


def prometheus_query(base: str, expr: str) -> list[tuple[dict, float]]:
    """Instant query against Prometheus at ``base``: ``[(labels, value), ...]``."""
    data = http_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if data.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {data}")
    return [(item["metric"], float(item["value"][1])) for item in data["data"]["result"]]
