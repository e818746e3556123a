"""Where received spans wait to be scored: in process, or on a Redis Stream shared by a fleet.

Both queues take a whole export request's jobs or none (:meth:`offer`), so the receiver can
refuse a request with a retryable code and the exporter re-sends it unchanged: no job is lost,
none is queued twice.

:class:`RedisStreamQueue` (redis-py) implements the fleet protocol:

* jobs are ``XADD`` ed to one stream (field ``job``: the JSON of a :class:`ScoreRequest`); the
  bound is the stream's length (entries are deleted once acknowledged), checked before adding;
* workers read them as one consumer group (``XREADGROUP``), each worker a consumer;
* a worker acknowledges (``XACK`` + ``XDEL``) only after the result was exported, and records
  the evaluation id as done (``SET ... EX``) just before: a job seen again (re-sent by an
  exporter, reclaimed after a crash that happened after the export) is recognised and
  acknowledged without being scored twice;
* entries a consumer took but never acknowledged (it died: ``kill -9``, OOM, node loss) are
  reclaimed by any worker with ``XAUTOCLAIM`` once idle for ``claim_idle`` seconds, and counted.
"""

from __future__ import annotations

import logging
import socket
import os
from typing import Any, Optional

from .jobs import ScoreRequest

logger = logging.getLogger("relevancy_tracer")

STREAM = "relevancy-tracer:evaluations"
GROUP = "relevancy-tracer-workers"
DONE_PREFIX = "relevancy-tracer:done:"


def consumer_name() -> str:
    """This process's consumer name in the group: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class RedisStreamQueue:
    """A bounded job queue on a Redis Stream with one consumer group.

    Args:
        url: ``redis://host:port/db``. stream, group: names. max_length: jobs queued or in
            flight at most (the stream's length). claim_idle: seconds after which another
            worker may reclaim a taken, unacknowledged job. done_ttl: seconds an evaluation id
            is remembered as done.
    """

    def __init__(self, url: str, *, stream: str = STREAM, group: str = GROUP, max_length: int = 10_000, claim_idle: float = 30.0, done_ttl: int = 86_400):
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10, health_check_interval=30)
        self.url = url
        self.stream = stream
        self.group = group
        self.max_length = max_length
        self.claim_idle = claim_idle
        self.done_ttl = done_ttl
        self._claim_cursor = "0-0"
        try:
            self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ---------------------------------------------------------------- receiver side

    def offer(self, requests: list[ScoreRequest]) -> bool:
        """Append every request or none; False when the stream is at its bound. An empty
        stream takes a request larger than the bound whole (it would be refused forever)."""
        if not requests:
            return True
        depth = self.redis.xlen(self.stream)
        if depth and depth + len(requests) > self.max_length:
            return False
        pipe = self.redis.pipeline(transaction=True)
        for request in requests:
            pipe.xadd(self.stream, {"job": request.to_json()})
        pipe.execute()
        return True

    def depth(self) -> int:
        """Jobs queued or taken and not yet acknowledged."""
        return int(self.redis.xlen(self.stream))

    # ---------------------------------------------------------------- worker side

    def read(self, consumer: str, count: int, block_ms: int = 1000) -> list[tuple[str, Optional[ScoreRequest]]]:
        """New jobs for ``consumer`` (blocks up to ``block_ms``): (entry id, request or None
        for a malformed entry)."""
        reply = self.redis.xreadgroup(self.group, consumer, {self.stream: ">"}, count=count, block=block_ms)
        return [(entry, request) for _, entries in reply or [] for entry, request in self._decode(entries)]

    def reclaim(self, consumer: str, count: int) -> list[tuple[str, Optional[ScoreRequest]]]:
        """Jobs other consumers took and left idle for ``claim_idle`` seconds, now ``consumer``'s."""
        reply = self.redis.xautoclaim(self.stream, self.group, consumer, min_idle_time=int(self.claim_idle * 1000), start_id=self._claim_cursor, count=count)
        self._claim_cursor = _text(reply[0]) if reply and reply[0] else "0-0"
        return list(self._decode(reply[1] if reply else []))

    def is_done(self, evaluation_id: str) -> bool:
        return bool(self.redis.exists(DONE_PREFIX + evaluation_id))

    def ack(self, entry_id: str, evaluation_id: Optional[str] = None) -> None:
        """Mark done (when an evaluation id is given), acknowledge and delete the entry."""
        pipe = self.redis.pipeline(transaction=True)
        if evaluation_id:
            pipe.set(DONE_PREFIX + evaluation_id, 1, ex=self.done_ttl)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.xdel(self.stream, entry_id)
        pipe.execute()

    def close(self) -> None:
        self.redis.close()

    @staticmethod
    def _decode(entries: Any) -> Any:
        for entry_id, fields in entries or []:
            if fields is None:  # deleted meanwhile
                continue
            raw = fields.get(b"job") if isinstance(fields, dict) else None
            try:
                request = ScoreRequest.from_json(raw) if raw is not None else None
            except (ValueError, TypeError):
                request = None
            yield _text(entry_id), request


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
