"""The unit of work of the scoring service: one span to score, serialisable for Redis Streams."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..phoenix import evaluation_id
from .selection import Candidate


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

    @classmethod
    def from_candidate(cls, candidate: Candidate, method: str, max_question_chars: int, max_answer_chars: int) -> "ScoreRequest":
        span = candidate.span
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
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: Any) -> "ScoreRequest":
        """Raises ValueError/TypeError for a malformed payload."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a score request is a JSON object")
        return cls(**data)
