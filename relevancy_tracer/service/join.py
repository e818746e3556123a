"""Joining GenAI content carried as OTLP log events to the spans it belongs to.

The OpenTelemetry GenAI conventions carry a call's messages as log-based events by default, not
as span attributes: OpenTelemetry's own instrumentations (``opentelemetry-instrumentation-openai-v2``
and the others built on ``opentelemetry-util-genai``) export a ``chat <model>`` span with the
operation, model, usage and finish reasons, and, on the same trace and span ids, log records:

* ``gen_ai.system.message`` / ``gen_ai.user.message`` / ``gen_ai.assistant.message`` /
  ``gen_ai.tool.message``: one per input message, body ``{"content": ...}`` (semantic
  conventions 1.30 and earlier; the content only with content capture on);
* ``gen_ai.choice``: one per choice, body ``{"index", "finish_reason", "message": {"role",
  "content", "tool_calls"}}``;
* ``gen_ai.client.inference.operation.details`` (the latest conventions): attributes
  ``gen_ai.input.messages`` / ``gen_ai.output.messages`` as on a span.

Spans and log records arrive in separate export requests, in either order. :class:`ContentJoin`
holds the half that came first, keyed by (trace id, span id), until the other half arrives:

* the question is the last ``gen_ai.user.message`` (by time, then arrival), or the last user
  message of ``gen_ai.input.messages``; the answer is the text of the first choice (lowest
  ``index``), or the assistant text of ``gen_ai.output.messages``;
* a call is complete once its span is there and an answer-bearing event (``gen_ai.choice`` or
  ``operation.details`` with output messages) arrived: its input events were emitted before
  its choices, so they are in the same or an earlier export of the app's batch processor. A
  complete call is scored, or skipped with a reason: ``tool_call`` (the first choice calls a
  tool and has no text), ``content_not_captured`` (events without content: the app runs with
  content capture off), ``no_user_message`` (no user message among the inputs);
* a half waits at most ``ttl`` seconds, then is dropped and counted by reason:
  ``span_without_content`` (a held span whose events never came: the app exports no logs, or
  not to this service) or ``content_without_span``; ``evicted`` when the buffer is at
  ``max_entries`` calls or ``max_chars`` characters of held text and the oldest half makes
  room. Keys of calls already scored or skipped are remembered for ``ttl`` (bounded likewise),
  so a late event of a handled call (content on the span and in events: ``SPAN_AND_EVENT``) is
  ignored rather than held.

Thread-safe. The caller looks up, queues, then commits (:meth:`ContentJoin.commit`) under
:attr:`ContentJoin.lock`, so a refused export request (queue full, retried by the exporter)
leaves the buffer as it was.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Optional

from .messages import load_json, message_texts, parts_text, read_message
from .otlp import ReceivedLog, ReceivedSpan

#: Event names this module reads (``gen_ai.<role>.message`` for every role).
CHOICE = "gen_ai.choice"
OPERATION_DETAILS = "gen_ai.client.inference.operation.details"
MESSAGE_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user", "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}
CONTENT_EVENTS = frozenset({CHOICE, OPERATION_DETAILS, *MESSAGE_EVENTS})

# skip reasons (``relevancy.status.reason`` of a ``skipped`` evaluation)
TOOL_CALL = "tool_call"
CONTENT_NOT_CAPTURED = "content_not_captured"
NO_USER_MESSAGE = "no_user_message"
NO_ANSWER = "no_answer"  # an answer-bearing event whose content is of no form read
# expiry reasons (``relevancy.service.join.expired``)
SPAN_WITHOUT_CONTENT = "span_without_content"
CONTENT_WITHOUT_SPAN = "content_without_span"
EVICTED = "evicted"

Key = tuple[str, str]


@dataclass(frozen=True)
class Content:
    """What the events of one call said so far (immutable: merging makes a new one).

    Attributes:
        question: the last user message text, with its (time_ns, arrival, index) order key.
        answer: the first choice's text (None: no text). answer_index: that choice's index
            (None: no answer-bearing event yet). tool_call: the first choice calls a tool.
        inputs: input message events seen (with or without content).
        turns: ``(order, role, text)`` of the user and assistant messages with text seen, for
            :attr:`history`. unread: events holding content of no form this module reads (so a
            call without text is not reported as one whose app captures no content).
    """

    question: Optional[str] = None
    question_order: tuple[int, ...] = (-1, -1, -1)
    answer: Optional[str] = None
    answer_index: Optional[int] = None
    tool_call: bool = False
    inputs: int = 0
    turns: tuple[tuple[tuple[int, ...], str, str], ...] = ()
    unread: int = 0

    @property
    def complete(self) -> bool:
        return self.answer_index is not None

    @property
    def chars(self) -> int:
        # the question is among the turns (counted once)
        return len(self.answer or "") + max(len(self.question or ""), sum(len(text) for _, _, text in self.turns))

    @property
    def history(self) -> list[dict]:
        """The earlier turns: user and assistant messages before the question, oldest first."""
        return [
            {"role": role, "content": text} for order, role, text in sorted(self.turns) if order < self.question_order
        ]

    def merge(self, other: "Content") -> "Content":
        question, order = (other.question, other.question_order) if other.question_order > self.question_order else (self.question, self.question_order)
        answer, index, tool = self.answer, self.answer_index, self.tool_call
        if other.answer_index is not None and (index is None or other.answer_index < index):
            answer, index, tool = other.answer, other.answer_index, other.tool_call
        return Content(
            question,
            order,
            answer,
            index,
            tool,
            self.inputs + other.inputs,
            self.turns + other.turns,
            self.unread + other.unread,
        )

    def outcome(self) -> tuple[Optional[tuple[str, str]], Optional[str]]:
        """((question, answer), None) to score, or (None, skip reason): ``content_not_captured``
        only when the events carry no content at all (not when it is of a form not read)."""
        if self.tool_call and not (self.answer or "").strip():
            return None, TOOL_CALL
        if not (self.answer or "").strip():
            return None, NO_ANSWER if self.unread else CONTENT_NOT_CAPTURED
        if not (self.question or "").strip():
            return None, NO_USER_MESSAGE if self.unread or not self.inputs else CONTENT_NOT_CAPTURED
        return (self.question.strip(), self.answer.strip()), None  # type: ignore[union-attr]


def _has_tool_call(message: Any) -> bool:
    if not isinstance(message, dict):
        return False
    if message.get("tool_calls"):
        return True
    parts = message.get("parts")
    if isinstance(parts, list) and any(isinstance(p, dict) and p.get("type") == "tool_call" for p in parts):
        return True
    content = message.get("content")  # Strands' content blocks: [{"toolUse": {...}}]
    return isinstance(content, list) and any(
        isinstance(p, dict) and ("toolUse" in p or p.get("type") in ("tool_call", "tool_use")) for p in content
    )


def _text(content: Any) -> Optional[str]:
    """Text of an event's content: a string (JSON of a list of parts is read as one), or the
    text parts of a list of parts (``{"type": "text", "text" | "content"}``, Strands'
    ``{"text"}``)."""
    if isinstance(content, str):
        if content[:1] == "[":
            parsed = load_json(content)
            if isinstance(parsed, list):
                return parts_text(parsed) or None
        return content
    if isinstance(content, list):
        return parts_text(content) or None
    return None


def _fields(record: ReceivedLog) -> dict:
    """An event's fields: its body when a map (or a JSON string of one: Semantic Kernel's),
    over its attributes (span events and some SDKs put the content there)."""
    body = record.body
    if isinstance(body, str) and body[:1] == "{":
        body = load_json(body)
    fields = dict(record.attributes)
    if isinstance(body, dict):
        fields.update(body)
    return fields


def content_of(record: ReceivedLog, arrival: int) -> Optional[Content]:
    """The :class:`Content` one GenAI event carries (a log record, or a span event as one),
    or None when it is not a content event. ``arrival`` orders events of equal timestamps."""
    name = record.event_name or str(record.attributes.get("event.name") or "")
    if name not in CONTENT_EVENTS:
        return None
    body = _fields(record)
    order = (record.time_ns, arrival, 0)
    if name in MESSAGE_EVENTS:
        role = str(body.get("role") or MESSAGE_EVENTS[name])
        text = _text(body.get("content")) if role in ("user", "assistant") else None
        unread = int(role == "user" and text is None and body.get("content") is not None)
        turns = ((order, role, text),) if text is not None and text.strip() else ()
        if role == "user" and text is not None:
            return Content(question=text, question_order=order, inputs=1, turns=turns)
        return Content(inputs=1, turns=turns, unread=unread)
    if name == CHOICE:
        message = load_json(body.get("message"))
        if isinstance(message, (list, str)):  # Strands: the content blocks, or the final text
            message = {"role": "assistant", "content": message}
        message = message if isinstance(message, dict) else {}
        index = body.get("index", 0)
        text = _text(message.get("content"))
        unread = int(text is None and message.get("content") is not None and not _has_tool_call(message))
        return Content(
            answer=text,
            answer_index=index if isinstance(index, int) else 0,
            tool_call=_has_tool_call(message),
            unread=unread,
        )
    # OPERATION_DETAILS
    inputs = load_json(body.get("gen_ai.input.messages"))
    outputs = load_json(body.get("gen_ai.output.messages"))
    messages = [m for m in (read_message(item) for item in inputs) if m is not None] if isinstance(inputs, list) else []
    last = max(
        (i for i, (role, text, _) in enumerate(messages) if role == "user" and text and text.strip()), default=None
    )
    turns = tuple(
        ((record.time_ns, arrival, i), role, text)
        for i, (role, text, _) in enumerate(messages)
        if role in ("user", "assistant") and text and text.strip()
    )
    content = Content(
        question=messages[last][1] if last is not None else None,
        question_order=(record.time_ns, arrival, last) if last is not None else (-1, -1, -1),
        inputs=len(inputs) if isinstance(inputs, list) else 0,
        turns=turns,
    )
    if isinstance(outputs, list):
        first = next((m for m in outputs if isinstance(m, dict)), {})
        texts = [text for role, text in message_texts([first]) if role in ("assistant", "")]
        content = replace(content, answer="".join(texts) or None, answer_index=0, tool_call=_has_tool_call(first))
    return content


def events_content(span: ReceivedSpan) -> Optional[Content]:
    """The :class:`Content` of a span's GenAI content events (``span.events``: Strands Agents'
    ``gen_ai.user.message`` / ``gen_ai.choice``, or ``gen_ai.client.inference.operation.details``
    on the span), read as log events are; None when it has none or no answer-bearing one."""
    found: Optional[Content] = None
    for arrival, event in enumerate(span.events):
        content = content_of(
            ReceivedLog(span.trace_id, span.span_id, event.name, None, event.attributes, time_ns=event.time_ns), arrival
        )
        if content is not None:
            found = content if found is None else found.merge(content)
    return found if found is not None and found.complete else None


def is_content_event(record: ReceivedLog) -> bool:
    """Whether ``record`` is a GenAI content event (by its event name, or ``event.name``)."""
    return (record.event_name or str(record.attributes.get("event.name") or "")) in CONTENT_EVENTS


@dataclass
class Held:
    """One half-joined call: its span (and the contexts found beside it) and/or its content."""

    since: float
    span: Optional[ReceivedSpan] = None
    contexts: Optional[list[str]] = None
    content: Content = field(default_factory=Content)

    @property
    def chars(self) -> int:
        return self.content.chars + sum(len(c) for c in self.contexts or [])


class ContentJoin:
    """The bounded buffer of half-joined GenAI calls (see the module docstring).

    Args:
        ttl: seconds a half waits (> 0). max_entries: calls held at once (>= 1).
        max_chars: characters of held text at once (>= 1).
        on_expired: ``fn(reason, count)`` for halves dropped (expired or evicted).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, ttl: float, max_entries: int, max_chars: int, on_expired: Callable[[str, int], None] = lambda reason, n: None, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.on_expired = on_expired
        self.clock = clock
        self.lock = threading.RLock()
        self._held: "OrderedDict[Key, Held]" = OrderedDict()
        self._done: "OrderedDict[Key, float]" = OrderedDict()
        self._chars = 0
        self._arrival = 0
        self.expired: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._held)

    @property
    def chars(self) -> int:
        return self._chars

    def fold(self, records: Iterable[ReceivedLog]) -> dict[Key, Content]:
        """The content of each call in ``records`` (content events only), by (trace, span)."""
        found: dict[Key, Content] = {}
        with self.lock:
            for record in records:
                self._arrival += 1
                content = content_of(record, self._arrival)
                if content is None:
                    continue
                key = (record.trace_id, record.span_id)
                found[key] = found[key].merge(content) if key in found else content
        return found

    def done(self, key: Key) -> bool:
        """Whether the call was scored or skipped within the last ``ttl`` seconds (call under
        :attr:`lock`)."""
        return key in self._done

    def get(self, key: Key) -> Optional[Held]:
        """The half held for ``key`` (call under :attr:`lock`; do not mutate it)."""
        return self._held.get(key)

    def commit(self, finished: Iterable[Key], holding: dict[Key, Held]) -> None:
        """After the queue took an export request: forget ``finished`` calls (remembered as
        done) and hold (replace) the halves in ``holding``; then expire and evict. Call under
        :attr:`lock`."""
        now = self.clock()
        for key in finished:
            self._drop(key)
            self._done[key] = now
            self._done.move_to_end(key)
        for key, held in holding.items():
            old = self._held.get(key)
            if old is not None:  # replaced in place: its place in the age order is kept
                self._chars -= old.chars
            self._held[key] = held
            self._chars += held.chars
        self.expire(now)
        while len(self._done) > self.max_entries:
            self._done.popitem(last=False)
        evicted = 0
        while self._held and (len(self._held) > self.max_entries or self._chars > self.max_chars):
            _, held = self._held.popitem(last=False)
            self._chars -= held.chars
            evicted += 1
        self._count(EVICTED, evicted)

    def expire(self, now: Optional[float] = None) -> None:
        """Drop halves older than ``ttl`` and forget done keys older than ``ttl``, counting the
        halves by reason."""
        with self.lock:
            now = self.clock() if now is None else now
            counts = {SPAN_WITHOUT_CONTENT: 0, CONTENT_WITHOUT_SPAN: 0}
            # insertion order is age order: a half replaced by a merge keeps its place and age
            while self._held:
                key, held = next(iter(self._held.items()))
                if now - held.since < self.ttl:
                    break
                self._drop(key)
                counts[SPAN_WITHOUT_CONTENT if held.span is not None else CONTENT_WITHOUT_SPAN] += 1
            while self._done and now - next(iter(self._done.values())) >= self.ttl:
                self._done.popitem(last=False)
            for reason, n in counts.items():
                self._count(reason, n)

    def _drop(self, key: Key) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._chars -= held.chars

    def _count(self, reason: str, n: int) -> None:
        if n:
            self.expired[reason] = self.expired.get(reason, 0) + n
            try:
                self.on_expired(reason, n)
            except Exception:  # a metrics failure never breaks the receiver
                pass
