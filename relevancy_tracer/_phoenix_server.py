"""Running Arize Phoenix locally (``phoenix serve``) and reading spans back over its REST API.

Used by ``relevancy-tracer demo`` and by the tests. Phoenix serves its UI, REST API and
OTLP/HTTP receiver (``/v1/traces``) on ``PHOENIX_PORT`` and OTLP/gRPC on ``PHOENIX_GRPC_PORT``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Optional

from ._lifeline import Child, spawn


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - local URL
        body = response.read()
    return json.loads(body) if body else None


class PhoenixServer:
    """A ``phoenix serve`` process on 127.0.0.1.

    Args:
        port: UI, REST and OTLP/HTTP port (the standard OTLP/HTTP port 4318 lets apps use the
            OpenTelemetry default endpoint). grpc_port: OTLP/gRPC port.
        working_dir: ``PHOENIX_WORKING_DIR`` (its SQLite database lives there).
    """

    def __init__(self, port: int, grpc_port: int, working_dir: Path):
        self.port = port
        self.grpc_port = grpc_port
        self.working_dir = Path(working_dir)
        self.url = f"http://127.0.0.1:{port}"
        self.process: Optional[Child] = None
        self.log_path = self.working_dir / "phoenix.log"

    def start(self, timeout: float = 180.0) -> "PhoenixServer":
        """Start the server and wait until ``/healthz`` answers. Raises RuntimeError."""
        self.working_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(self.port),
            PHOENIX_GRPC_PORT=str(self.grpc_port),
            PHOENIX_WORKING_DIR=str(self.working_dir.resolve()),
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        for name in list(env):
            if name.startswith("OTEL_"):
                del env[name]  # Phoenix must not export its own telemetry to itself
        executable = shutil.which("phoenix", path=str(Path(sys.executable).parent)) or shutil.which("phoenix")
        command = [executable, "serve"] if executable else [sys.executable, "-m", "phoenix.server.main", "serve"]
        log = open(self.log_path, "ab")
        try:  # the server dies with this process, however it ends (SIGKILL and crashes included)
            self.process = spawn(command, env=env, stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"phoenix serve exited with {self.process.returncode}; see {self.log_path}")
                if self.healthy():
                    return self
                time.sleep(0.5)
        except BaseException:  # SIGTERM / Ctrl-C while waiting: the child must not outlive us
            self.stop()
            raise
        self.stop()
        raise RuntimeError(f"phoenix serve did not become healthy within {timeout:.0f} s; see {self.log_path}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:  # noqa: S310
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 20 s); a no-op when it is not running."""
        if self.process is not None:
            self.process.stop(grace=20.0)

    def __enter__(self) -> "PhoenixServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- REST API
    def spans(self, project: str, **filters: Any) -> list[dict]:
        """Spans of ``project`` (``GET /v1/projects/{project}/spans``), all pages."""
        spans: list[dict] = []
        cursor: Optional[str] = None
        while True:
            query = {"limit": 1000, **filters}
            if cursor:
                query["cursor"] = cursor
            url = f"{self.url}/v1/projects/{urllib.parse.quote(project)}/spans?{urllib.parse.urlencode(query, doseq=True)}"
            try:
                page = _get(url)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # the project does not exist yet
                    return []
                raise
            spans.extend(page.get("data") or [])
            cursor = page.get("next_cursor")
            if not cursor:
                return spans

    def wait_for_spans(self, project: str, predicate: Any, timeout: float = 60.0, **filters: Any) -> list[dict]:
        """Poll :meth:`spans` until ``predicate(spans)`` holds or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        spans: list[dict] = []
        while time.monotonic() < deadline:
            spans = self.spans(project, **filters)
            if predicate(spans):
                return spans
            time.sleep(0.5)
        return spans

    def trace_url(self, trace_id: str) -> str:
        """The UI page of a trace (Phoenix redirects by OpenTelemetry trace id)."""
        return f"{self.url}/redirects/traces/{trace_id}"

    def project_url(self, project: str) -> str:
        return f"{self.url}/redirects/projects/{urllib.parse.quote(project)}"
