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
from ..dataset.writing import write_atomically
from ..phoenix_annotations import PhoenixClient, annotation_for
from ..scoring.engine import Engine
from .jobs import ScoreRequest
from .otlp import ReceivedSpan
from .selection import Selection, SpanSelector

logger = logging.getLogger("relevancy_tracer")


@dataclass
class BackfillReport:
    """Counts of one run: spans seen, already annotated (skipped), scored, failed; ``interrupted``
    when :meth:`Backfill.stop` ended it early (the scores finished by then are annotated)."""

    seen: int = 0
    already_annotated: int = 0
    scored: int = 0
    failed: int = 0
    interrupted: bool = False


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


def read_state(state: Path) -> Optional[str]:
    """The page cursor saved in ``state`` (None when the file does not exist). Raises
    ``ValueError`` naming the file when it is unreadable, not JSON or not a state object."""
    try:
        data = json.loads(state.read_bytes())
        if not isinstance(data, dict) or not isinstance(data.get("cursor"), (str, type(None))):
            raise ValueError('expected {"cursor": "..."}')
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"cannot read the state file {state} ({exc}); delete it to start from the first page") from exc
    return data.get("cursor")


class Backfill:
    """One backfill run (see module doc); :meth:`stop` ends it early from a signal handler or
    another thread: scoring in flight is cancelled, the scores finished by then are annotated,
    and ``state`` keeps the cursor of the last page done whole (the next run re-reads the
    page and skips what was annotated).

    Arguments as :func:`backfill`. Raises ``ValueError`` at construction when ``state`` exists
    and cannot be read."""

    def __init__(self, phoenix_url: str, project: str, settings: Optional[Settings] = None, *, since: Optional[str] = None, state: Optional[Path] = None, selection: Optional[Selection] = None, page_size: int = 100):
        self.settings = settings or Settings.resolve()
        self.phoenix_url, self.project, self.since, self.state, self.page_size = phoenix_url, project, since, state, page_size
        self.cursor = read_state(state) if state is not None else None
        self.selector = SpanSelector(selection or Selection(outermost_only=False, max_contexts=self.settings.max_contexts, max_context_chars=self.settings.max_context_chars))
        self._stopped = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task] = None

    def stop(self) -> None:
        """End the run after annotating what is finished (safe in a signal handler)."""
        self._stopped = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    def run(self) -> BackfillReport:
        """Score and annotate the project's spans that lack the annotation. Raises PhoenixError
        when Phoenix cannot be read."""
        settings, state = self.settings, self.state
        engine = Engine(settings)
        client = PhoenixClient(self.phoenix_url)
        report = BackfillReport()
        self._loop = loop = asyncio.new_event_loop()
        try:
            for spans, next_cursor in client.iter_spans(self.project, start_time=self.since, cursor=self.cursor, page_size=self.page_size):
                if self._stopped:
                    break
                report.seen += len(spans)
                candidates = self.selector.select([received(s, self.project) for s in spans])
                done = client.annotated_span_ids(self.project, [c.span.span_id for c in candidates]) if candidates else set()
                requests = []
                for candidate in candidates:
                    if candidate.span.span_id in done:
                        report.already_annotated += 1
                    else:
                        requests.append(ScoreRequest.from_candidate(candidate, settings.method, settings.max_question_chars, settings.max_answer_chars, settings.max_history_turns, settings.max_history_chars))
                self._task = loop.create_task(_score_all(engine, requests, settings.concurrency))
                if self._stopped:  # stopped before the task existed
                    self._task.cancel()
                results = loop.run_until_complete(self._task)
                annotations = []
                for request, result in zip(requests, results):
                    if result is None:  # cancelled by stop()
                        continue
                    annotation = annotation_for(result, request.span_id, request.evaluation_id, capture_content=settings.capture_content) if result.ok else None
                    if annotation is None:
                        report.failed += 1
                    else:
                        annotations.append(annotation)
                client.annotate(annotations, sync=True)
                report.scored += len(annotations)
                if self._stopped:
                    break
                if state is not None and next_cursor:
                    write_atomically(state, json.dumps({"cursor": next_cursor}))
        finally:
            self._task = None
            loop.close()
            client.close()
        report.interrupted = self._stopped
        if state is not None and not report.interrupted:
            state.unlink(missing_ok=True)  # the run finished: the next one starts from the beginning (and skips annotated spans)
        return report


def backfill(phoenix_url: str, project: str, settings: Optional[Settings] = None, *, since: Optional[str] = None, state: Optional[Path] = None, selection: Optional[Selection] = None, page_size: int = 100) -> BackfillReport:
    """Score and annotate the project's spans that lack the annotation (:class:`Backfill`).
    Raises PhoenixError when Phoenix cannot be read, ValueError when ``state`` cannot be read."""
    return Backfill(phoenix_url, project, settings, since=since, state=state, selection=selection, page_size=page_size).run()


async def _score_all(engine: Engine, requests: list[ScoreRequest], concurrency: int) -> list[Any]:
    """Results in request order; None for requests not finished when the task was cancelled."""
    limit = asyncio.Semaphore(max(1, concurrency))
    results: list[Any] = [None] * len(requests)

    async def one(index: int, request: ScoreRequest) -> None:
        async with limit:
            results[index] = await engine.ascore(request.question, request.answer, request.contexts, history=request.history)

    try:
        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    except asyncio.CancelledError:  # Backfill.stop(): keep what finished
        pass
    return results
