"""Where received spans wait to be scored: in process, or on a Redis Stream shared by a fleet.

Both queues take a whole export request's jobs or none (:meth:`offer`), so the receiver can
refuse a request with a retryable code and the exporter re-sends it unchanged: no job is lost,
none is queued twice.

:class:`RedisStreamQueue` (redis-py) implements the fleet protocol:

* jobs are ``XADD`` ed to one stream (field ``job``: the JSON of a :class:`ScoreRequest`); the
  bound is the stream's length (entries are deleted once acknowledged), checked before adding;
* workers read them as one consumer group (``XREADGROUP``), each worker a consumer; a group
  that disappeared (Redis restarted empty, ``NOGROUP``) is re-created at once, from the
  stream's start, so jobs queued since are read;
* a worker acknowledges (``XACK`` + ``XDEL``) only after the result was exported, and records
  the evaluation id as done (``SET ... EX``) just before: a job seen again (re-sent by an
  exporter, reclaimed after a crash that happened after the export) is recognised and
  acknowledged without being scored twice;
* while a worker holds a job it extends its claim (``XCLAIM ... JUSTID`` every quarter of
  ``claim_idle``, only while the job is still its own), so a slow evaluation is never taken by
  another worker;
* a worker writes a result only while it still holds the job and it is not done, checked and
  its claim extended in one Lua script (:meth:`may_write`): a worker paused past ``claim_idle``
  (SIGSTOP, a GC pause, a VM migration) whose job another worker took drops its result;
* a job left pending (its worker died, or released it after a transient failure) is
  reclaimed by any worker with ``XCLAIM`` once idle for its retry delay, ``claim_idle`` times
  2^(deliveries - 1) (exponential backoff; at most ``max(claim_idle, 900)`` s); the claim's
  minimum idle time makes it exclusive, and Redis counts the deliveries;
* a job that cannot be scored (malformed, or failed on its ``max_deliveries``-th delivery) is
  moved to the stream ``<stream>:dead-letter`` with its error (:meth:`dead_letter`), in one
  transaction with its acknowledgement;
* a job deleted from the stream while pending (``XDEL``, ``XTRIM`` by an operator or another
  client) is lost: the first worker to find it (extending its claim, checking it may write,
  reclaiming it) acknowledges it, clearing its pending entry, and counts it once (the ``XACK``
  that cleared it); a result scored for it is dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .jobs import ScoreRequest

logger = logging.getLogger("relevancy_tracer")

STREAM = "relevancy-tracer:evaluations"
GROUP = "relevancy-tracer-workers"
DONE_PREFIX = "relevancy-tracer:done:"
#: Contexts shared by the jobs of one export request's trace are stored once under this prefix
#: (a hash: ``contexts`` JSON, ``refs`` jobs still holding them).
CONTEXTS_PREFIX = "relevancy-tracer:contexts:"
#: The dead-letter stream is the job stream's name plus this suffix.
DEAD_LETTER_SUFFIX = ":dead-letter"
#: Default bound of the dead-letter stream in bytes of its entries' fields (64 MiB: about
#: 1,600 letters of the largest jobs the default budgets allow, 41 KB, more of smaller ones).
DEAD_LETTER_MAX_BYTES = 64 * 1024 * 1024


#: Extends the claim of the entries ``ARGV[3..]`` of stream ``KEYS[1]`` (group ``ARGV[1]``) that
#: consumer ``ARGV[2]`` still holds. An entry another worker reclaimed meanwhile (this one was
#: paused) is left to it: ``XCLAIM`` with no minimum idle time would take it back. An entry
#: deleted from the stream meanwhile (``XDEL``, ``XTRIM``) is acknowledged (its pending entry
#: cleared) instead; returns the ids of those this call cleared (Redis 7's ``XCLAIM`` would clear
#: it silently, Redis 6's would keep it pending for ever).
_EXTEND_HELD = """
local deleted = {}
for i = 3, #ARGV do
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
    if #pending > 0 and pending[1][2] == ARGV[2] then
        if #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) == 0 then
            if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then deleted[#deleted + 1] = ARGV[i] end
        else
            redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
        end
    end
end
return deleted
"""

#: Whether consumer ``ARGV[2]`` may write the result of entry ``ARGV[3]`` of stream ``KEYS[1]``
#: (group ``ARGV[1]``), whose done marker is ``KEYS[2]``: ``done`` (marker set: another worker
#: wrote it), ``lost`` (the entry is no longer pending for this consumer: reclaimed by another
#: worker), ``deleted`` (still pending for this consumer but deleted from the stream, ``XDEL`` or
#: ``XTRIM``: acknowledged here, its pending entry cleared), ``gone`` (neither pending for this
#: consumer nor in the stream: cleared by another call, or acknowledged by another worker), else
#: ``held``, and its claim is extended (its idle time reset), so no worker reclaims it for
#: ``claim_idle`` while the result is written. One script: nothing runs between the checks and
#: the extension.
_MAY_WRITE = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'done' end
local exists = #redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3]) > 0
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending == 0 or pending[1][2] ~= ARGV[2] then
    if exists then return 'lost' end
    return 'gone'
end
if not exists then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
    return 'deleted'
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 'held'
"""


def consumer_name() -> str:
    """This process's consumer name in the group: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Delivery:
    """One job as a worker received it.

    Attributes:
        entry_id: the stream entry id. job: the raw ``job`` field (bytes), None when absent.
        request: the parsed job, None when malformed. error: why it is malformed (names the
        field, never user text). deliveries: times Redis delivered it, this one included.
    """

    entry_id: str
    job: Optional[bytes]
    request: Optional[ScoreRequest]
    error: Optional[str]
    deliveries: int


class RedisStreamQueue:
    """A bounded job queue on a Redis Stream with one consumer group.

    Args:
        url: ``redis://host:port/db``. stream, group: names. max_length: jobs queued or in
            flight at most (the stream's length). claim_idle: seconds (> 0) without a claim
            extension after which another worker may reclaim a taken, unacknowledged job
            (doubled at each further delivery, see :meth:`retry_delay`). done_ttl: seconds an
            evaluation id is remembered as done. dead_letter_max_length, dead_letter_max_bytes:
            dead letters kept, in number and in bytes of their fields (the oldest are deleted
            first; the bytes are counted in the key ``<stream>:dead-letter:bytes``).
    """

    def __init__(self, url: str, *, stream: str = STREAM, group: str = GROUP, max_length: int = 10_000, claim_idle: float = 30.0, done_ttl: int = 86_400, dead_letter_max_length: int = 100_000, dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES):
        import redis

        if not claim_idle > 0:
            raise ValueError(f"claim_idle must be > 0; got {claim_idle!r}")
        self.redis = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10, health_check_interval=30)
        self.url = url
        self.stream = stream
        self.dead_letter_stream = stream + DEAD_LETTER_SUFFIX
        self.group = group
        self.max_length = max_length
        self.claim_idle = claim_idle
        self.done_ttl = done_ttl
        self.dead_letter_max_length = dead_letter_max_length
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self.dead_letter_bytes_key = self.dead_letter_stream + ":bytes"
        self.groups_created = 0
        self._claim_cursor = "-"
        self._extend_held = self.redis.register_script(_EXTEND_HELD)
        self._may_write = self.redis.register_script(_MAY_WRITE)
        self._scripts_allowed = True  # False once Redis said NOPERM (an ACL without +@scripting)
        try:
            self._create_group()
        except redis.RedisError as exc:  # Redis full or unreachable: the first read creates it
            logger.warning("relevancy-tracer: cannot create the consumer group %s of %s yet (%s); retrying on the next read", self.group, self.stream, describe_redis_error(exc))

    def _create_group(self) -> None:
        import redis

        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            self.groups_created += 1
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _grouped(self, command: Callable[[], Any]) -> Any:
        """Run a group command; when the group is gone (``NOGROUP``: Redis restarted empty or
        the group was destroyed) re-create it from the stream's start and run it again."""
        import redis

        try:
            return command()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        logger.warning("relevancy-tracer: consumer group %s of %s was missing (Redis restarted empty?); re-created", self.group, self.stream)
        self._create_group()
        self._claim_cursor = "-"
        return command()

    # ---------------------------------------------------------------- receiver side

    def offer(self, requests: list[ScoreRequest]) -> bool:
        """Append every request or none; False when the stream is at its bound. An empty
        stream takes a request larger than the bound whole (it would be refused forever).

        Contexts are stored once per distinct list among the request's jobs (the RETRIEVER
        documents of a trace, shared by its root spans), in a hash with a count of the jobs
        holding them, deleted when the last one is acknowledged (at the latest after
        ``done_ttl``); each job carries their id. Each stored list counts as one entry
        against ``max_length``, as a job does."""
        if not requests:
            return True
        stored: dict[str, list] = {}  # contexts id -> [json, jobs holding it]
        batch = os.urandom(8).hex()
        queued = []
        for request in requests:
            if request.contexts:
                text = json.dumps(request.contexts, ensure_ascii=False, separators=(",", ":"))
                contexts_id = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32] + "-" + batch
                stored.setdefault(contexts_id, [text, 0])[1] += 1
                request = dataclasses.replace(request, contexts=None, contexts_id=contexts_id)
            queued.append(request)
        depth = self.redis.xlen(self.stream)
        if depth and depth + len(queued) + len(stored) > self.max_length:
            return False
        pipe = self.redis.pipeline(transaction=True)
        for contexts_id, (text, refs) in stored.items():
            pipe.hset(CONTEXTS_PREFIX + contexts_id, mapping={"contexts": text, "refs": refs})
            pipe.expire(CONTEXTS_PREFIX + contexts_id, self.done_ttl)
        for request in queued:
            pipe.xadd(self.stream, {"job": request.to_json()})
        pipe.execute()
        return True

    def _with_contexts(self, deliveries: list["Delivery"]) -> list["Delivery"]:
        """Fill in the stored contexts of jobs that carry a ``contexts_id`` (one round trip). A
        list no longer stored (expired, Redis restarted empty) leaves the job without contexts,
        with a warning."""
        wanted = [d for d in deliveries if d.request is not None and d.request.contexts_id]
        if not wanted:
            return deliveries
        pipe = self.redis.pipeline(transaction=False)
        for delivery in wanted:
            pipe.hget(CONTEXTS_PREFIX + delivery.request.contexts_id, "contexts")  # type: ignore[union-attr]
        for delivery, text in zip(wanted, pipe.execute()):
            contexts = None
            try:
                contexts = json.loads(text) if text is not None else None
            except ValueError:
                pass
            if isinstance(contexts, list) and all(isinstance(c, str) for c in contexts):
                delivery.request.contexts = contexts  # type: ignore[union-attr]
            else:
                logger.warning("relevancy-tracer: the contexts of job %s are no longer stored (expired, or Redis restarted); scoring it without them", delivery.entry_id)
        return deliveries

    def _release_contexts(self, contexts_ids: list[str]) -> None:
        """One job fewer holds each of ``contexts_ids``; a list no job holds is deleted."""
        if not contexts_ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for contexts_id in contexts_ids:
            pipe.hincrby(CONTEXTS_PREFIX + contexts_id, "refs", -1)
        left = pipe.execute(raise_on_error=False)
        gone = [CONTEXTS_PREFIX + c for c, refs in zip(contexts_ids, left) if isinstance(refs, int) and refs <= 0]
        if gone:
            self.redis.delete(*gone)

    def depth(self) -> int:
        """Jobs queued or taken and not yet acknowledged."""
        return int(self.redis.xlen(self.stream))

    # ---------------------------------------------------------------- worker side

    def read(self, consumer: str, count: int, block_ms: int = 1000) -> list[Delivery]:
        """New jobs for ``consumer`` (blocks up to ``block_ms``), each delivered once so far."""
        reply = self._grouped(lambda: self.redis.xreadgroup(self.group, consumer, {self.stream: ">"}, count=count, block=block_ms))
        return self._with_contexts([_delivery(entry_id, fields, 1) for _, entries in reply or [] for entry_id, fields in entries or [] if fields is not None])

    def retry_delay(self, deliveries: int) -> float:
        """Seconds a job delivered ``deliveries`` times must stay idle (unextended) before it is
        reclaimed: ``claim_idle * 2 ** (deliveries - 1)``, at most ``max(claim_idle, 900)``."""
        return min(self.claim_idle * 2 ** max(0, min(deliveries - 1, 30)), max(self.claim_idle, 900.0))

    def reclaim(self, consumer: str, count: int, on_deleted: Optional[Callable[[int], None]] = None) -> list[Delivery]:
        """Up to ``count`` pending jobs idle for at least their :meth:`retry_delay`, now
        ``consumer``'s (their delivery count incremented). Scans the pending entries from a
        cursor, so entries still waiting for their backoff never hide later ones.

        A pending job deleted from the stream (``XDEL``, ``XTRIM`` by an operator or another
        client) can never be delivered again: its pending entry is acknowledged (cleared), and
        ``on_deleted`` is called with how many this call cleared (the ``XACK`` count: a job
        another worker acknowledged meanwhile is not counted)."""
        page_size = max(32, 4 * count)
        start = self._claim_cursor if self._claim_cursor == "-" else "(" + self._claim_cursor
        pending = self._grouped(lambda: self.redis.xpending_range(self.stream, self.group, start, "+", page_size, idle=int(self.claim_idle * 1000)))
        due = []
        cursor = "-"
        for entry in pending:
            if len(due) >= count:  # resume after the last entry examined
                break
            entry_id = cursor = _text(entry["message_id"])
            deliveries = int(entry["times_delivered"])
            delay_ms = int(self.retry_delay(deliveries) * 1000)
            if int(entry["time_since_delivered"]) >= delay_ms:
                due.append((entry_id, deliveries, delay_ms))
        else:
            cursor = cursor if len(pending) == page_size else "-"
        self._claim_cursor = cursor
        if due:  # which of them are still in the stream (one round trip)
            pipe = self.redis.pipeline(transaction=False)
            for entry_id, _, _ in due:
                pipe.xrange(self.stream, entry_id, entry_id)
            present = pipe.execute()
            deleted = [entry_id for (entry_id, _, _), entries in zip(due, present) if not entries]
            if deleted:
                cleared = int(self._grouped(lambda: self.redis.xack(self.stream, self.group, *deleted)))
                if cleared and on_deleted is not None:
                    on_deleted(cleared)
            due = [d for d, entries in zip(due, present) if entries]
        out: list[Delivery] = []
        for entry_id, deliveries, delay_ms in due:
            claimed = self._grouped(lambda: self.redis.xclaim(self.stream, self.group, consumer, delay_ms, [entry_id]))
            for claimed_id, fields in claimed or []:  # empty: another worker was first, or it was deleted
                if fields is not None:
                    out.append(_delivery(claimed_id, fields, deliveries + 1))
        return self._with_contexts(out)

    def extend(self, consumer: str, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of jobs ``consumer`` holds (``XCLAIM ... JUSTID``: the delivery
        count is unchanged), so no other worker reclaims them while they are being scored.
        Checked and extended in one Lua script: a job another worker reclaimed meanwhile (this
        one was paused past ``claim_idle``) is not taken back. Returns the held jobs found
        deleted from the stream (``XDEL``, ``XTRIM``): acknowledged by this call, they are lost."""
        if not entry_ids:
            return []
        deleted = self._scripted(
            lambda: self._extend_held(keys=[self.stream], args=[self.group, consumer, *entry_ids]),
            lambda: self._extend_held_unscripted(consumer, entry_ids),
        )
        return [_text(entry_id) for entry_id in deleted or []]

    def _holder(self, entry_id: str) -> Optional[str]:
        """The consumer holding the pending entry ``entry_id``, or None when it is not pending."""
        pending = self.redis.xpending_range(self.stream, self.group, entry_id, entry_id, 1)
        return _text(pending[0]["consumer"]) if pending else None

    def _exists(self, entry_id: str) -> bool:
        return bool(self.redis.xrange(self.stream, entry_id, entry_id))

    def _extend_held_unscripted(self, consumer: str, entry_ids: list[str]) -> list[str]:
        """:meth:`extend` for a Redis user that may not run scripts: the same checks, not atomic."""
        mine, deleted = [], []
        for entry_id in entry_ids:
            if self._holder(entry_id) == consumer:
                if self._exists(entry_id):
                    mine.append(entry_id)
                elif self.redis.xack(self.stream, self.group, entry_id):
                    deleted.append(entry_id)
        if mine:
            self.redis.xclaim(self.stream, self.group, consumer, 0, mine, justid=True)
        return deleted

    def _may_write_unscripted(self, consumer: str, entry_id: str, done_key: str) -> str:
        """:meth:`may_write` for a Redis user that may not run scripts: the same checks, not atomic."""
        if self.redis.exists(done_key):
            return "done"
        exists = self._exists(entry_id)
        if self._holder(entry_id) != consumer:
            return "lost" if exists else "gone"
        if not exists:
            return "deleted" if self.redis.xack(self.stream, self.group, entry_id) else "gone"
        self.redis.xclaim(self.stream, self.group, consumer, 0, [entry_id], justid=True)
        return "held"

    def _scripted(self, scripted: Callable[[], Any], unscripted: Callable[[], Any]) -> Any:
        """Run ``scripted`` (a Lua script), or ``unscripted`` when the Redis user may not run
        scripts (an ACL without ``+@scripting``: ``NOPERM``); that is logged once, and from then
        on the checks run as separate commands (not atomic: a worker paused between them could
        still write a result twice)."""
        if self._scripts_allowed:
            try:
                return self._grouped(scripted)
            except Exception as exc:
                if "NOPERM" not in str(exc) and type(exc).__name__ != "NoPermissionError":
                    raise
                self._scripts_allowed = False
                logger.warning(
                    "relevancy-tracer: the Redis user may not run Lua scripts (%s); a job's ownership is checked with"
                    " separate commands, not atomically: allow +evalsha and +eval (or +@scripting) for the worker's user",
                    describe_redis_error(exc),
                )
        return self._grouped(unscripted)

    def may_write(self, consumer: str, entry_id: str, evaluation_id: Optional[str]) -> str:
        """Whether ``consumer`` may write the result of the job ``entry_id`` now: ``held`` (it
        still holds the job and no result was recorded as done; its claim is extended, so
        nobody reclaims it while the result is written and exported), ``done`` (another worker
        finished it), ``lost`` (another worker reclaimed it: this one was paused past
        ``claim_idle``), ``deleted`` (deleted from the stream, ``XDEL`` or ``XTRIM``, while held:
        acknowledged by this call) or ``gone`` (deleted and already cleared, or acknowledged by
        another worker). Checked atomically (one Lua script), so of two workers that scored the
        same job one writes. Raises ``redis.RedisError`` (unreachable, out of memory)."""
        done_key = DONE_PREFIX + (evaluation_id or "")
        answer = self._scripted(
            lambda: self._may_write(keys=[self.stream, done_key], args=[self.group, consumer, entry_id]),
            lambda: self._may_write_unscripted(consumer, entry_id, done_key),
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def is_done(self, evaluation_id: str) -> bool:
        return bool(self.redis.exists(DONE_PREFIX + evaluation_id))

    def ack(self, entry_id: str, evaluation_id: Optional[str] = None, contexts_id: Optional[str] = None) -> bool:
        """Mark done (when an evaluation id is given), acknowledge and delete the entry, in one
        transaction. Returns True, or False when Redis is at ``maxmemory``: it then refuses
        every transaction and the ``SET`` (Redis rejects any command queued in ``MULTI`` when
        out of memory), so the entry is acknowledged and deleted without its done marker
        (``XACK`` and ``XDEL`` are allowed and free memory): it is never delivered again, only
        an exporter's re-sent copy could be scored a second time.

        ``contexts_id``: the job's stored contexts, released (deleted with their last job).

        Raises ``redis.RedisError`` when Redis is unreachable (the caller retries)."""
        pipe = self.redis.pipeline(transaction=True)
        if evaluation_id:
            pipe.set(DONE_PREFIX + evaluation_id, 1, ex=self.done_ttl)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.xdel(self.stream, entry_id)
        try:
            self._grouped(pipe.execute)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
        else:
            if contexts_id:
                self._release_contexts([contexts_id])
            return True
        plain = self.redis.pipeline(transaction=False)  # one round trip, in order, no MULTI
        plain.xack(self.stream, self.group, entry_id)
        plain.xdel(self.stream, entry_id)
        self._grouped(plain.execute)
        return False  # its stored contexts (HINCRBY is refused at maxmemory) expire after done_ttl

    def dead_letter(self, delivery: Delivery, error: str, consumer: str) -> None:
        """Move a job to ``<stream>:dead-letter`` and acknowledge it, in one transaction.

        The dead letter's fields: ``job`` (the payload as received), ``error`` (why: a type or
        field name, never user text), ``deliveries``, ``entry_id`` (in the job stream),
        ``consumer``, ``time_ms`` (Unix milliseconds), and ``contexts`` (their JSON) when the job
        referred to stored contexts, which are released. Its evaluation id is not recorded as
        done, so adding the ``job`` back to the stream scores it again.
        """
        pipe = self.redis.pipeline(transaction=True)
        letter = {"job": delivery.job if delivery.job is not None else b"", "error": error, "deliveries": delivery.deliveries, "entry_id": delivery.entry_id, "consumer": consumer, "time_ms": int(time.time() * 1000)}
        request = delivery.request
        if request is not None and request.contexts_id and request.contexts is not None:
            letter["contexts"] = json.dumps(request.contexts, ensure_ascii=False, separators=(",", ":"))
        size = _letter_bytes(letter)
        pipe.xadd(self.dead_letter_stream, letter)
        pipe.incrby(self.dead_letter_bytes_key, size)
        pipe.xlen(self.dead_letter_stream)
        pipe.xack(self.stream, self.group, delivery.entry_id)
        pipe.xdel(self.stream, delivery.entry_id)
        _, total, count, _, _ = self._grouped(pipe.execute)
        if int(total) > self.dead_letter_max_bytes or int(count) > self.dead_letter_max_length:
            self._trim_dead_letters()
        if request is not None and request.contexts_id:
            self._release_contexts([request.contexts_id])

    def _trim_dead_letters(self) -> None:
        """Delete the oldest dead letters until both bounds hold (``dead_letter_max_bytes``,
        ``dead_letter_max_length``), counting the bytes deleted. Concurrent trims by several
        workers each count only the entries they deleted themselves."""
        total = int(self.redis.get(self.dead_letter_bytes_key) or 0)
        count = int(self.redis.xlen(self.dead_letter_stream))
        start = "-"
        while total > self.dead_letter_max_bytes or count > self.dead_letter_max_length:
            page = self.redis.xrange(self.dead_letter_stream, start, "+", count=100)
            if not page:  # the stream was emptied behind the count's back: start over
                self.redis.set(self.dead_letter_bytes_key, 0)
                return
            doomed = []
            for entry_id, fields in page:
                if total <= self.dead_letter_max_bytes and count <= self.dead_letter_max_length:
                    break
                size = _letter_bytes(fields)
                doomed.append((entry_id, size))
                total, count = total - size, count - 1
            pipe = self.redis.pipeline(transaction=False)
            for entry_id, _ in doomed:
                pipe.xdel(self.dead_letter_stream, entry_id)
            deleted = pipe.execute()
            freed = sum(size for (_, size), gone in zip(doomed, deleted) if gone)
            if freed:
                self.redis.decrby(self.dead_letter_bytes_key, freed)
            start = "(" + _text(page[-1][0])

    def dead_letter_bytes(self) -> int:
        """Bytes of the dead letters' fields, as counted."""
        return int(self.redis.get(self.dead_letter_bytes_key) or 0)

    def dead_letters(self) -> int:
        """Jobs in the dead-letter stream."""
        return int(self.redis.xlen(self.dead_letter_stream))

    def close(self) -> None:
        self.redis.close()


#: How the logs describe Redis' refusal at ``maxmemory``.
OUT_OF_MEMORY = "Redis is out of memory (used memory > maxmemory) and refuses writes until memory is freed: raise maxmemory, or let the workers drain the stream"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a Redis error is its refusal at ``maxmemory`` (``OOM command not allowed``)."""
    import redis

    return isinstance(exc, getattr(redis.exceptions, "OutOfMemoryError", ())) or (isinstance(exc, redis.ResponseError) and ("OOM" in str(exc) or "maxmemory" in str(exc)))


def describe_redis_error(exc: BaseException) -> str:
    """A one-line account of a Redis error for the logs (what to do when it is at ``maxmemory``),
    never quoting a command's arguments (they hold user text)."""
    import redis

    if is_out_of_memory(exc):
        return OUT_OF_MEMORY
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"{type(exc).__name__}: {exc}"  # host and port, no payload
    # a reply error of a pipeline quotes the command and its arguments (job texts): only the
    # server's reason is kept
    reason = str(exc).rpartition("caused error: ")[2] if isinstance(exc, redis.ResponseError) else ""
    return f"{type(exc).__name__}: {reason[:200]}" if reason else type(exc).__name__


def _delivery(entry_id: Any, fields: Any, deliveries: int) -> Delivery:
    raw = fields.get(b"job") if isinstance(fields, dict) else None
    if raw is None:
        return Delivery(_text(entry_id), None, None, "no job field", deliveries)
    try:
        return Delivery(_text(entry_id), raw, ScoreRequest.from_json(raw), None, deliveries)
    except ValueError as exc:
        return Delivery(_text(entry_id), raw, None, str(exc), deliveries)


def _letter_bytes(fields: Any) -> int:
    """Bytes of a stream entry's field names and values (what the byte bound counts)."""
    return sum(len(_raw(key)) + len(_raw(value)) for key, value in fields.items())


def _raw(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
