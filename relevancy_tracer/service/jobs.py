"""The unit of work of the scoring service: one span to score, serialisable for Redis Streams."""

from __future__ import annotations

import json
import time
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Optional

from ..otel.results import evaluation_id
from ..scoring import conversation
from ..scoring.methods import METHODS
from .selection import Candidate

_HEX = re.compile(r"[0-9a-fA-F]+")
_CONTEXTS_ID = re.compile(r"[0-9a-f]{32}-[0-9a-f]{16}")


@dataclass
class ScoreRequest:
    """One received span to score.

    Attributes:
        evaluation_id: 32 hex digits, deterministic per (trace id, span id, method): a retried
            or re-sent job is recognised, and its Phoenix annotation upserted.
        trace_id, span_id: the scored span (hex). span_name, service_name: of the scored span
            and its app. project: the app's Phoenix project (resource attribute), if any.
        question, answer, contexts: the texts, truncated to the scoring budgets.
        method: the relevancy method. received_ns: Unix nanoseconds when the receiver took it.
        contexts_id: on a Redis Stream, the id of the contexts stored once for the jobs of a
            trace that share them (``contexts`` is then None until the worker reads them back,
            see ``queue.py``); None otherwise.
        history: the conversation's earlier turns, ``[{"role": "user" | "assistant",
            "content"}]`` oldest first, as read from the span's messages and bounded by
            ``max_history_turns`` / ``max_history_chars``; None for a single turn.
    """

    evaluation_id: str
    trace_id: str
    span_id: str
    span_name: str
    service_name: str
    question: str
    answer: str
    method: str
    contexts: Optional[list[str]] = None
    project: Optional[str] = None
    received_ns: int = field(default_factory=time.time_ns)
    contexts_id: Optional[str] = None
    history: Optional[list[dict]] = None

    @classmethod
    def from_candidate(cls, candidate: Candidate, method: str, max_question_chars: int, max_answer_chars: int, max_history_turns: int = 8, max_history_chars: int = 6000) -> "ScoreRequest":
        span = candidate.span
        try:
            past = conversation.read_history(getattr(candidate, "history", None) or None, max_history_turns, max_history_chars)
        except conversation.HistoryError:
            past = conversation.History()
        return cls(
            evaluation_id=evaluation_id(span.trace_id, span.span_id, method),
            trace_id=span.trace_id,
            span_id=span.span_id,
            span_name=span.name,
            service_name=span.service_name,
            question=candidate.question[: max_question_chars + 1],
            answer=candidate.answer[: max_answer_chars + 1],
            method=method,
            contexts=candidate.contexts,
            project=span.project,
            history=past.as_messages() or None,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: Any) -> "ScoreRequest":
        """Parse and validate one queued job (``text``: str or UTF-8 bytes).

        Raises:
            ValueError: the payload is not UTF-8 JSON, not an object, has unknown or missing
                fields, or a field of the wrong type or form (ids: lowercase or uppercase hex
                of 32 digits for ``evaluation_id`` and ``trace_id``, 16 for ``span_id``, not all
                zero). The message names the field, never its value (it may be user text).
        """
        try:
            data = json.loads(text)
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ValueError("a score request is a JSON object")
        names = {f.name for f in fields(cls)}
        unknown = sorted(str(k)[:40] for k in data if k not in names)
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(unknown[:5])}" + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
        missing = sorted(f.name for f in fields(cls) if f.name not in data and f.default is MISSING and f.default_factory is MISSING)
        if missing:
            raise ValueError(f"missing field(s): {', '.join(missing)}")
        for name, digits in (("evaluation_id", 32), ("trace_id", 32), ("span_id", 16)):
            value = data[name]
            if not isinstance(value, str) or not _HEX.fullmatch(value) or len(value) != digits or int(value, 16) == 0:
                raise ValueError(f"{name} must be {digits} hex digits, not all zero")
        for name in ("span_name", "service_name", "question", "answer", "method"):
            if not isinstance(data[name], str):
                raise ValueError(f"{name} must be a string; got {type(data[name]).__name__}")
        if data["method"] not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}")
        contexts = data.get("contexts")
        if contexts is not None and (not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts)):
            raise ValueError("contexts must be a list of strings or null")
        if data.get("project") is not None and not isinstance(data["project"], str):
            raise ValueError("project must be a string or null")
        contexts_id = data.get("contexts_id")
        if contexts_id is not None and (not isinstance(contexts_id, str) or not _CONTEXTS_ID.fullmatch(contexts_id)):
            raise ValueError("contexts_id must be 32 and 16 hex digits joined by '-', or null")
        history = data.get("history")
        if history is not None and (
            not isinstance(history, list)
            or not all(isinstance(t, dict) and set(t) == {"role", "content"} and t["role"] in ("user", "assistant") and isinstance(t["content"], str) for t in history)
        ):
            raise ValueError('history must be a list of {"role": "user" | "assistant", "content": str} or null')
        received = data.get("received_ns", 0)
        if isinstance(received, bool) or not isinstance(received, int):
            raise ValueError("received_ns must be an integer")
        return cls(**data)
