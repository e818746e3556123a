"""PhoenixClient's retries against a real HTTP server on 127.0.0.1: the server's Retry-After
(seconds or an HTTP date, capped) and, without one, jittered exponential backoff."""

from __future__ import annotations

import json
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from relevancy_tracer.phoenix_annotations import PhoenixClient, PhoenixError, retry_after_seconds, retry_delay


class ScriptedServer:
    """Answers each request with the next scripted (status, headers); the last one repeats.
    Records the monotonic time each request arrived."""

    def __init__(self, replies: list[tuple[int, dict[str, str]]]):
        self.replies = list(replies)
        self.arrivals: list[float] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.arrivals.append(time.monotonic())
                status, headers = server.replies.pop(0) if len(server.replies) > 1 else server.replies[0]
                body = json.dumps({"data": []} if status < 400 else {"error": status}).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


ANNOTATION = {
    "span_id": "eee19b7ec3c1b174",
    "name": "answer_relevancy",
    "annotator_kind": "LLM",
    "result": {"score": 0.9},
}


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_in_seconds_is_waited_before_the_retry(status):
    with ScriptedServer([(status, {"Retry-After": "1"}), (200, {})]) as server:
        client = PhoenixClient(server.url, retries=2, backoff=0.01)
        client.annotate([ANNOTATION])
        client.close()
    assert len(server.arrivals) == 2
    assert 0.95 <= server.gaps()[0] < 3.0, server.gaps()  # not the 0.01 s backoff


def test_a_retry_after_as_an_http_date_is_waited_until_that_date():
    # an HTTP date has whole seconds: 2 s ahead is at least 1 s ahead once truncated
    with ScriptedServer([(503, {"Retry-After": formatdate(time.time() + 2, usegmt=True)}), (200, {})]) as server:
        client = PhoenixClient(server.url, retries=2, backoff=0.01)
        client.annotate([ANNOTATION])
        client.close()
    assert len(server.arrivals) == 2
    assert 0.95 <= server.gaps()[0] < 3.5, server.gaps()


def test_a_long_retry_after_is_capped_at_max_delay():
    with ScriptedServer([(429, {"Retry-After": "3600"}), (200, {})]) as server:
        client = PhoenixClient(server.url, retries=2, backoff=0.01, max_delay=0.3)
        started = time.monotonic()
        client.annotate([ANNOTATION])
        client.close()
    assert len(server.arrivals) == 2 and time.monotonic() - started < 3.0
    assert 0.28 <= server.gaps()[0] < 2.0, server.gaps()


def test_without_retry_after_the_waits_are_jittered_below_an_exponential_bound():
    with ScriptedServer([(503, {})]) as server:
        client = PhoenixClient(server.url, retries=4, backoff=0.2, max_delay=10.0)
        with pytest.raises(PhoenixError, match="failed after 5 attempts"):
            client.annotate([ANNOTATION])
        client.close()
    gaps = server.gaps()
    assert len(server.arrivals) == 5
    # retry k waits uniform in [0, 0.2 * 2**k): never above the bound (plus the request's time)
    for attempt, gap in enumerate(gaps):
        assert gap < 0.2 * 2**attempt + 0.25, gaps


def test_a_client_error_is_not_retried():
    with ScriptedServer([(404, {"Retry-After": "1"})]) as server:
        client = PhoenixClient(server.url, retries=3, backoff=0.01)
        with pytest.raises(PhoenixError, match="HTTP 404"):
            client.annotate([ANNOTATION])
        client.close()
    assert len(server.arrivals) == 1


def test_retry_delay_is_full_jitter_exponential_backoff_or_the_capped_retry_after():
    assert retry_delay(0, draw=lambda: 0.5, base=0.5) == 0.25
    assert retry_delay(3, draw=lambda: 0.5, base=0.5) == 2.0
    assert retry_delay(10, draw=lambda: 0.5, base=0.5, cap=10.0) == 5.0  # the exponential is capped
    assert retry_delay(0, draw=lambda: 0.0) == 0.0
    assert retry_delay(3, "7", draw=lambda: 0.5) == 7.0 and retry_delay(3, "60", cap=10.0) == 10.0
    assert retry_delay(1, "soon", draw=lambda: 0.5, base=0.5) == 0.5  # an invalid header: the backoff
    draws = {retry_delay(4) for _ in range(50)}  # the default draw is random
    assert len(draws) > 40 and all(0.0 <= d < 8.0 for d in draws)


def test_retry_after_seconds_reads_seconds_and_http_dates():
    now = 1_700_000_000.0
    assert retry_after_seconds("120") == 120.0 and retry_after_seconds(" 0 ") == 0.0
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now=now) == 0.0  # already past
    for value in (None, "", "-5", "1.5", "soon", "Wed, 99 Foo 2023 07:28:00 GMT"):
        assert retry_after_seconds(value) is None, value
