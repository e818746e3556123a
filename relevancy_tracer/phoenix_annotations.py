"""Arize Phoenix as a sink: relevancy results written as span annotations.

Phoenix shows span annotations as badges in its trace tree and can filter on them; plain span
attributes are not shown there. Each scored answer becomes one annotation on the scored span:
name ``answer_relevancy``, annotator kind ``LLM``, the score, label and explanation, the evidence
(generated questions and their similarities, with content capture on), the method and the
evaluator version in the metadata, and ``identifier`` = the evaluation id, a hash of (trace id,
span id, method) — Phoenix upserts on (name, span, identifier), so a retried evaluation replaces
its annotation instead of adding a second one.

* :class:`PhoenixClient`: the REST calls (``POST /v1/span_annotations``, span and annotation
  listing for backfills), over httpx with timeouts, retries on 408/429/5xx and connection
  errors (after the server's ``Retry-After``, capped, else a jittered exponential backoff:
  :func:`retry_delay`), and ``Authorization: Bearer $PHOENIX_API_KEY`` when that is set.
* :class:`PhoenixAnnotationSink`: for the in-app decorator: ``submit()`` never blocks; a bounded
  queue is drained by one daemon thread in batches; failures and drops are counted and logged
  once, never raised; ``flush``/``shutdown`` are bounded.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable, Iterator, Optional

from ._background import fork as _fork
from .result import RelevancyResult

logger = logging.getLogger("relevancy_tracer")

ANNOTATION_NAME = "answer_relevancy"


def annotation_for(result: RelevancyResult, span_id: str, identifier: str, *, capture_content: bool) -> Optional[dict]:
    """The span annotation of a scored result (None when the evaluation failed).

    The metadata holds the method, evaluator version, raw score, whether the score is
    calibrated, the failure kind (below ``directly_addresses``), the evidence and the prior; the generated questions, their similarities and noncommittal flags only with
    content capture on.
    """
    if not result.ok:
        return None
    metadata: dict[str, Any] = {
        "method": result.method,
        "evaluator_version": result.evaluator_version,
        "raw_score": result.raw_score,
        "calibrated": result.calibrated,
        "components": dict(result.components),
    }
    if result.failure_kind:
        metadata["failure_kind"] = result.failure_kind
    if result.evidence is not None:
        metadata["evidence"] = result.evidence
        metadata["prior"] = result.prior
    if capture_content:
        from .otel.spans import encodable

        metadata["generated_questions"] = [encodable(q) for q in result.generated_questions]
        metadata["similarities"] = list(result.similarities)
        metadata["noncommittal"] = list(result.noncommittal)
    return {
        "span_id": span_id,
        "name": ANNOTATION_NAME,
        "annotator_kind": "LLM",
        "result": {"score": result.score, "label": result.label, "explanation": result.explanation},
        "metadata": metadata,
        "identifier": identifier,
    }


class PhoenixError(Exception):
    """A Phoenix REST call failed (after retries)."""


#: HTTP statuses a request is retried on (besides connection errors and timeouts).
RETRY_STATUSES = frozenset({408, 429, *range(500, 600)})


def retry_after_seconds(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """The wait a ``Retry-After`` header asks for, in seconds (RFC 9110 10.2.3): a number of
    seconds, or an HTTP date (how long until then from ``now``, default ``time.time()``; 0 once
    past). None when the header is absent or neither form."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is in GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_delay(
    attempt: int,
    retry_after: Optional[str] = None,
    *,
    base: float = 0.5,
    cap: float = 10.0,
    draw: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    The server's ``Retry-After`` header when it has a valid one (seconds or an HTTP date), at
    most ``cap``; else "full jitter" exponential backoff: uniform in
    ``[0, min(cap, base * 2**attempt))`` (``draw`` gives the uniform [0, 1) draw), so clients
    that failed together do not retry together."""
    asked = retry_after_seconds(retry_after)
    if asked is not None:
        return min(asked, cap)
    return draw() * min(cap, base * 2.0**attempt)


class PhoenixClient:
    """Phoenix's REST API (the calls this package needs).

    Args:
        url: Phoenix base URL (``http://host:6006``). api_key: bearer token (default
            ``PHOENIX_API_KEY``). timeout: seconds per request. retries: retries on 408, 429,
            5xx and connection errors (default 3), each after :func:`retry_delay`: the
            response's ``Retry-After`` when it has one, else a jittered exponential backoff
            from ``backoff`` s (default 0.5); either at most ``max_delay`` s (default 10).

    Raises:
        ImportError: httpx is not installed (the ``annotations`` extra).
    """

    def __init__(
        self,
        url: str,
        api_key: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_delay: float = 10.0,
    ):
        try:
            import httpx
        except ImportError as exc:
            raise ImportError(f"the Phoenix client needs httpx ({exc}): pip install 'relevancy-tracer[annotations]'") from exc

        self.url = url.rstrip("/")
        headers = {"Content-Type": "application/json"}
        key = api_key if api_key is not None else os.environ.get("PHOENIX_API_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.retries = retries
        self.backoff = backoff
        self.max_delay = max_delay

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The decoded JSON reply of one REST call (None for an empty body), retried as the
        class says. Raises PhoenixError: a 4xx other than 408/429 at once, else after the
        last attempt."""
        import httpx

        for attempt in range(self.retries + 1):
            retry_after: Optional[str] = None
            try:
                response = self._client.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                error: Exception = exc
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                if response.status_code not in RETRY_STATUSES:
                    raise PhoenixError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
                error = PhoenixError(f"{method} {path}: HTTP {response.status_code}")
                retry_after = response.headers.get("Retry-After")
            if attempt < self.retries:
                time.sleep(retry_delay(attempt, retry_after, base=self.backoff, cap=self.max_delay))
        raise PhoenixError(f"{method} {path} failed after {self.retries + 1} attempts: {error}")

    def annotate(self, annotations: list[dict], sync: bool = True) -> None:
        """Upsert span annotations (``POST /v1/span_annotations``). With ``sync`` Phoenix
        writes them before answering (404 when a span is unknown). Raises PhoenixError."""
        if annotations:
            self._request("POST", "/v1/span_annotations", params={"sync": "true" if sync else "false"}, json={"data": annotations})

    def spans(self, project: str, *, start_time: Optional[str] = None, cursor: Optional[str] = None, limit: int = 100, names: Optional[list[str]] = None) -> tuple[list[dict], Optional[str]]:
        """One page of a project's spans, oldest first: (spans, next cursor or None)."""
        params: list[tuple[str, Any]] = [("limit", limit), ("sort", "start_time"), ("order", "asc")]
        if start_time:
            params.append(("start_time", start_time))
        if cursor:
            params.append(("cursor", cursor))
        for name in names or []:
            params.append(("name", name))
        try:
            page = self._request("GET", f"/v1/projects/{project}/spans", params=params)
        except PhoenixError as exc:
            if "HTTP 404" in str(exc):
                return [], None
            raise
        return list(page.get("data") or []), page.get("next_cursor")

    def annotated_span_ids(self, project: str, span_ids: Iterable[str], name: str = ANNOTATION_NAME) -> set[str]:
        """Which of ``span_ids`` already carry an annotation named ``name``."""
        ids = list(span_ids)
        found: set[str] = set()
        for start in range(0, len(ids), 100):
            params: list[tuple[str, Any]] = [("span_ids", sid) for sid in ids[start : start + 100]] + [("include_annotation_names", name), ("limit", 1000)]
            cursor: Optional[str] = None
            while True:
                page = self._request("GET", f"/v1/projects/{project}/span_annotations", params=params + ([("cursor", cursor)] if cursor else []))
                for annotation in page.get("data") or []:
                    if annotation.get("name") == name:
                        found.add(annotation["span_id"])
                cursor = page.get("next_cursor")
                if not cursor:
                    break
        return found

    def iter_spans(self, project: str, *, start_time: Optional[str] = None, cursor: Optional[str] = None, names: Optional[list[str]] = None, page_size: int = 100) -> Iterator[tuple[list[dict], Optional[str]]]:
        """Pages of (spans, cursor to resume after this page)."""
        while True:
            spans, cursor = self.spans(project, start_time=start_time, cursor=cursor, limit=page_size, names=names)
            yield spans, cursor
            if not cursor:
                return


class PhoenixAnnotationSink:
    """Non-blocking annotation writer for the in-app tracer.

    Args:
        url: Phoenix base URL. api_key: default ``PHOENIX_API_KEY``. queue_size: annotations
            held at most (more are dropped and counted). batch_size: annotations per request.
            interval: seconds between sends of a partial batch.

    Attributes:
        sent, failed, dropped: annotation counts (failed: the request failed after retries).
    """

    def __init__(self, url: str, api_key: Optional[str] = None, queue_size: int = 2000, batch_size: int = 100, interval: float = 1.0):
        self.client = PhoenixClient(url, api_key, timeout=10.0, retries=2)
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.interval = interval
        self.sent = self.failed = self.dropped = 0
        self._warned = False
        self._renew()
        _fork.renew_after_fork(self, PhoenixAnnotationSink._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._in_flight = 0
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def submit(self, annotation: dict) -> bool:
        """Queue one annotation without blocking; False when dropped (queue full or closed)."""
        with self._lock:
            if self._closed or len(self._queue) >= self.queue_size:
                self.dropped += 1
                return False
            self._queue.append(annotation)
            start = self._thread is None or not self._thread.is_alive()
            if len(self._queue) >= self.batch_size:
                self._wake.notify()
        if start:
            self._start()
        return True

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            thread = threading.Thread(target=self._run, name="relevancy-tracer-phoenix", daemon=True)
            self._thread = thread
        try:
            thread.start()
        except RuntimeError:  # no thread can be started: the annotations wait for the next submit
            with self._lock:
                self._thread = None

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._closed:
                    self._wake.wait(self.interval)
                if not self._queue:
                    if self._closed:
                        return
                    continue
                batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
                self._in_flight = len(batch)
            try:
                self.client.annotate(batch, sync=False)
                ok = True
            except Exception as exc:  # counted and logged once; the app never sees it
                ok = False
                if not self._warned:
                    self._warned = True
                    logger.warning("relevancy-tracer: writing Phoenix annotations failed (%s); counted in the sink's stats", type(exc).__name__)
            with self._wake:
                if ok:
                    self.sent += len(batch)
                else:
                    self.failed += len(batch)
                self._in_flight = 0
                self._wake.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued annotation was sent (or failed); False on timeout."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._wake:
            self._wake.notify_all()
            while self._queue or self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return not self._queue and not self._in_flight
                self._wake.wait(min(remaining, 0.1))
        return True

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Flush for up to ``timeout`` s, then stop; queued annotations left are dropped."""
        ok = self.flush(timeout)
        with self._wake:
            self._closed = True
            self.dropped += len(self._queue)
            self._queue.clear()
            self._wake.notify_all()
        return ok
