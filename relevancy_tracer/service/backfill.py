"""``relevancy-tracer backfill``: score spans already stored in Phoenix and annotate them.

Pages through a project's spans oldest first (Phoenix's ``GET /v1/projects/{project}/spans``),
selects them as ``serve`` does (``selection.py``), skips spans already carrying the
``answer_relevancy`` annotation (so a second run scores nothing: idempotent), scores the rest and
upserts their annotations (``identifier`` = evaluation id). After each page the cursor is saved
to ``--state`` (when given), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..config import Settings
from ..phoenix import PhoenixClient, annotation_for
from ..scoring.engine import Engine
from .jobs import ScoreRequest
from .otlp import ReceivedSpan
from .selection import Selection, SpanSelector

logger = logging.getLogger("relevancy_tracer")


@dataclass
class BackfillReport:
    """Counts of one run: spans seen, already annotated (skipped), scored, failed."""

    seen: int = 0
    already_annotated: int = 0
    scored: int = 0
    failed: int = 0


def received(span: dict, project: str) -> ReceivedSpan:
    """A Phoenix REST span (``context.trace_id``/``span_id``, ``parent_id``, ``attributes``) as
    the receiver's :class:`ReceivedSpan`."""
    context = span.get("context") or {}
    attributes = dict(span.get("attributes") or {})
    kind = span.get("span_kind")
    if kind and "openinference.span.kind" not in attributes:
        attributes["openinference.span.kind"] = kind
    return ReceivedSpan(
        trace_id=str(context.get("trace_id", "")),
        span_id=str(context.get("span_id", "")),
        parent_span_id=span.get("parent_id") or "",
        name=str(span.get("name", "")),
        kind=1,  # INTERNAL: Phoenix's REST spans do not carry the OTLP kind
        attributes=attributes,
        resource={"service.name": project, "openinference.project.name": project},
        scope="",
    )


def backfill(phoenix_url: str, project: str, settings: Optional[Settings] = None, *, since: Optional[str] = None, state: Optional[Path] = None, selection: Optional[Selection] = None, page_size: int = 100) -> BackfillReport:
    """Score and annotate the project's spans that lack the annotation. Raises PhoenixError when
    Phoenix cannot be read."""
    settings = settings or Settings.resolve()
    selector = SpanSelector(selection or Selection(outermost_only=False, max_contexts=settings.max_contexts, max_context_chars=settings.max_context_chars))
    engine = Engine(settings)
    client = PhoenixClient(phoenix_url)
    report = BackfillReport()
    cursor = None
    if state is not None and state.exists():
        cursor = json.loads(state.read_text(encoding="utf-8")).get("cursor")
    loop = asyncio.new_event_loop()
    try:
        for spans, next_cursor in client.iter_spans(project, start_time=since, cursor=cursor, page_size=page_size):
            report.seen += len(spans)
            candidates = selector.select([received(s, project) for s in spans])
            done = client.annotated_span_ids(project, [c.span.span_id for c in candidates]) if candidates else set()
            requests = []
            for candidate in candidates:
                if candidate.span.span_id in done:
                    report.already_annotated += 1
                else:
                    requests.append(ScoreRequest.from_candidate(candidate, settings.method, settings.max_question_chars, settings.max_answer_chars))
            results = loop.run_until_complete(_score_all(engine, requests, settings.concurrency))
            annotations = []
            for request, result in zip(requests, results):
                annotation = annotation_for(result, request.span_id, request.evaluation_id, capture_content=settings.capture_content) if result.ok else None
                if annotation is None:
                    report.failed += 1
                else:
                    annotations.append(annotation)
            client.annotate(annotations, sync=True)
            report.scored += len(annotations)
            if state is not None and next_cursor:
                state.write_text(json.dumps({"cursor": next_cursor}), encoding="utf-8")
    finally:
        loop.close()
        client.close()
    if state is not None and state.exists():
        state.unlink()  # the run finished: the next one starts from the beginning (and skips annotated spans)
    return report


async def _score_all(engine: Engine, requests: list[ScoreRequest], concurrency: int) -> list[Any]:
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(request: ScoreRequest) -> Any:
        async with limit:
            return await engine.ascore(request.question, request.answer, request.contexts)

    return list(await asyncio.gather(*(one(r) for r in requests)))
