"""Once per call, whatever the batching: the decision window of ``serve``.

An app's spans reach the service in as many export requests as its span processor makes: a
``SimpleSpanProcessor`` exports each span alone, a ``BatchSpanProcessor`` cuts a trace wherever
its batch ends, and an exporter re-sends a request whose answer it did not get. Choosing "the
outermost candidate of each trace" within one request scores a LlamaIndex query once per span,
and a re-sent request twice. So, as the Collector's tail-sampling processor holds a trace for
``decision_wait`` before deciding on it, :class:`DecisionWindow` holds each trace's candidate
spans and decides on the trace once no span of it arrived for ``wait`` seconds:

* every span of the trace seen (candidate or not) is remembered as ``span id -> parent id``, so
  a candidate is recognised as nested in another whatever request brought each of them;
* a candidate that is the trace's root (no parent) is the outermost by definition: it is chosen
  at once (in the request that brings it, so a full queue refuses that request and the exporter
  re-sends it), and every other candidate of the trace, held or arriving later, is covered;
* otherwise, when the window ends, the held candidates not nested in another candidate of the
  trace (held, or chosen before) are chosen; a candidate arriving after its trace was decided is
  chosen when it is nested in nothing chosen, and counted ``late`` (not scored) when a span
  already scored is nested in it (the window was shorter than the gap between the two);
* a span id seen before in the trace (an exporter's retry, a duplicate) is ignored and counted
  ``duplicate``;
* when the trace's root is an agent run (:func:`~.selection.agent_run`) that does not read (its
  span holds no question or answer) and several calls inside it are chosen together, only
  the last to end is (the run's final answer); the others are its steps, counted ``covered``;
* spans that look like calls but yield no question or answer (:class:`~.selection.Skipped`)
  are reported once the trace is decided, unless a chosen candidate covers them or is nested
  in them (that call was scored);
* a GenAI call awaiting its content events (convention ``genai-events``) nested in a skipped
  span whose app records no content (reason ``content_not_captured``: a Traceloop workflow
  with ``TRACELOOP_TRACE_CONTENT=false``, whose setting the instrumentations inside share) is
  not chosen, counted ``uncaptured``: its events, if any, carry no content either; the outer
  span is reported skipped, so the count says why nothing was scored.

Bounds: at most ``max_traces`` traces held open or remembered, at most ``max_spans`` span ids
remembered and ``max_chars`` characters of held text (candidate texts and retrieved documents).
Past a bound the oldest open trace is decided early (counted ``early``) and the oldest decided
trace forgotten. A trace is held at most ``max_hold`` seconds after its first span (default 6 x
``wait``) even while spans keep arriving, and remembered ``remember`` seconds after its decision
(default 10 x ``wait``) to recognise retries and late spans. The window adds no thread: the
service calls :meth:`DecisionWindow.plan` and :meth:`DecisionWindow.reserve` per request under
:attr:`DecisionWindow.lock`, queues the ready candidates outside it (queue offers stay
concurrent; a concurrent request carrying the same spans sees them as duplicates), then
:meth:`DecisionWindow.release` and :meth:`DecisionWindow.commit` under it again; and
:meth:`DecisionWindow.due` from its sweeper.
"""

from __future__ import annotations

import threading
import time
from collections import ChainMap, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional

from ..otel import attributes as A
from .otlp import ReceivedSpan
from .selection import CONTENT_NOT_CAPTURED, Candidate, Skipped, span_documents

# outcomes (``relevancy.decision.outcome`` of ``relevancy.service.decision``)
ROOT = "root"  # a trace root chosen in its own request
WINDOW = "window"  # chosen when its trace's window ended
EARLY = "early"  # chosen early: a bound was reached
LATE = "late"  # arrived after a span nested in it was scored: not scored
DUPLICATE = "duplicate"  # a span id seen before (retry, duplicate): ignored
COVERED = "covered"  # nested in a chosen candidate: not scored (the outer call is)
UNCAPTURED = "uncaptured"  # awaiting content events inside a call whose app records no content


@dataclass
class _Trace:
    first: float
    last: float
    parents: dict[str, str] = field(default_factory=dict)
    open: dict[str, Candidate] = field(default_factory=dict)
    skipped: dict[str, Skipped] = field(default_factory=dict)
    documents: list[str] = field(default_factory=list)
    chosen: set[str] = field(default_factory=set)
    root_chosen: bool = False
    decided_at: Optional[float] = None
    chars: int = 0
    pending_since: Optional[float] = None  # when a call awaiting its content events was first held


@dataclass
class Plan:
    """What one export request changes: ``ready`` candidates to queue now (their contexts set),
    and the spans, candidates and skipped spans to hold (:meth:`DecisionWindow.commit`)."""

    spans: list[ReceivedSpan]
    ready: list[Candidate]
    hold: list[Candidate]
    skipped: list[Skipped]
    outcomes: dict[str, int]
    keys: set[tuple[str, str]] = field(default_factory=set)


def _light(span: ReceivedSpan, keys: bool = False) -> ReceivedSpan:
    """``span`` without its attribute values (with ``keys``: its first 100 keys, values None)
    and with only the resource attributes the service writes (``service.name``, the Phoenix
    project)."""
    attributes = {str(k)[:100]: None for k in list(span.attributes)[:100]} if keys else {}
    resource = {k: v for k, v in span.resource.items() if k in ("service.name", "openinference.project.name")}
    return replace(span, attributes=attributes, resource=resource, events=[])


def _candidate_chars(candidate: Candidate) -> int:
    return (
        len(candidate.question)
        + len(candidate.answer)
        + sum(len(c) for c in candidate.contexts or [])
        + sum(len(str(turn.get("content", ""))) for turn in candidate.history)
    )


class DecisionWindow:
    """The per-trace decision window (see the module docstring).

    Args:
        wait: seconds without a new span of a trace before its held candidates are chosen
            (> 0). max_traces: traces held open or remembered at once (>= 1). max_spans: span
            ids remembered at once (>= 1). max_chars: characters of held text at once (>= 1).
        max_documents, max_document_chars: retrieved documents kept per trace (count, and
            characters in all), for contexts.
        max_hold: seconds a trace is held at most after its first span (default 6 x wait).
        max_pending_hold: seconds a trace is held at most after a GenAI call awaiting its
            content events (convention ``genai-events``) was first held in it (default
            ``max_hold``; the service passes half the join's ``join_ttl``, so those events are
            still held by the join when the call reaches it).
        remember: seconds a decided trace is remembered (default 10 x wait).
        on_outcome: ``fn(outcome, count)`` for every count above.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, wait: float, max_traces: int, max_spans: int, max_chars: int, *, max_documents: int = 16, max_document_chars: int = 32000, max_hold: Optional[float] = None, max_pending_hold: Optional[float] = None, remember: Optional[float] = None, on_outcome: Callable[[str, int], None] = lambda outcome, n: None, clock: Callable[[], float] = time.monotonic):
        self.wait = wait
        self.max_traces = max_traces
        self.max_spans = max_spans
        self.max_chars = max_chars
        self.max_documents = max_documents
        self.max_document_chars = max_document_chars
        self.max_hold = 6 * wait if max_hold is None else max_hold
        self.max_pending_hold = self.max_hold if max_pending_hold is None else max_pending_hold
        self.remember = 10 * wait if remember is None else remember
        self.on_outcome = on_outcome
        self.clock = clock
        self.lock = threading.RLock()
        self._traces: "OrderedDict[str, _Trace]" = OrderedDict()  # by first arrival
        self._spans = 0
        self._chars = 0
        self._inflight: dict[tuple[str, str], int] = {}  # span keys of requests being queued
        self.outcomes: dict[str, int] = {}

    # ------------------------------------------------------------------ sizes

    def __len__(self) -> int:
        return len(self._traces)

    @property
    def spans(self) -> int:
        """Span ids remembered."""
        return self._spans

    @property
    def chars(self) -> int:
        """Characters of held text."""
        return self._chars

    def held(self) -> int:
        """Candidates held open."""
        return sum(len(t.open) for t in self._traces.values())

    # ------------------------------------------------------------------ per request

    def plan(self, spans: Iterable[ReceivedSpan], candidates: list[Candidate], skipped: list[Skipped]) -> Plan:
        """What the request's ``spans`` (with their ``candidates`` and ``skipped`` spans, from
        :meth:`~.selection.SpanSelector.classify`) change, without changing anything yet.
        Call under :attr:`lock`, then :meth:`commit` once the ready candidates were queued."""
        spans = list(spans)
        outcomes: dict[str, int] = {}
        batch: dict[str, dict[str, str]] = {}
        fresh: set[tuple[str, str]] = set()
        for span in spans:
            trace = self._traces.get(span.trace_id)
            seen = batch.setdefault(span.trace_id, {})
            if (trace is not None and span.span_id in trace.parents) or span.span_id in seen or (span.trace_id, span.span_id) in self._inflight:
                continue  # seen before, or in a request being queued now (a concurrent retry)
            seen[span.span_id] = span.parent_span_id
            fresh.add((span.trace_id, span.span_id))
        retrieved: dict[str, list[str]] = {}
        for span in spans:
            if span.attributes.get(A.OPENINFERENCE_SPAN_KIND) == "RETRIEVER" and (span.trace_id, span.span_id) in fresh:
                retrieved.setdefault(span.trace_id, []).extend(span_documents(span.attributes))
        ready, hold = [], []
        for candidate in candidates:
            key = (candidate.span.trace_id, candidate.span.span_id)
            if key not in fresh:
                outcomes[DUPLICATE] = outcomes.get(DUPLICATE, 0) + 1
                continue
            fresh.discard(key)  # a candidate listed twice is one candidate
            if candidate.span.parent_span_id:
                hold.append(candidate)
                continue
            trace = self._traces.get(candidate.span.trace_id)
            if trace is not None and trace.chosen:
                # a span nested in this root was scored: its ancestry reaches the root, or a
                # span never received (the one root of a trace holds every other span)
                parents = ChainMap(batch.get(candidate.span.trace_id, {}), trace.parents)
                ancestors = self._ancestors(parents, trace.chosen)
                if candidate.span.span_id in ancestors or any(node not in parents for node in ancestors):
                    outcomes[LATE] = outcomes.get(LATE, 0) + 1
                    continue
            candidate.contexts = self._trace_documents(None, span_documents(candidate.span.attributes)) or self._trace_documents(trace, retrieved.get(candidate.span.trace_id, []))
            ready.append(candidate)
            outcomes[ROOT] = outcomes.get(ROOT, 0) + 1
        fresh_skipped = [item for item in skipped if (item.span.trace_id, item.span.span_id) in fresh]  # a re-sent one was counted
        keys = {(trace_id, span_id) for trace_id, seen in batch.items() for span_id in seen}
        return Plan(spans, ready, hold, fresh_skipped, outcomes, keys)

    def reserve(self, plan: Plan) -> None:
        """Mark the plan's spans as being queued (call under :attr:`lock`): a concurrent request
        carrying them (an exporter's retry while the first attempt waits on the queue) sees
        them as duplicates. :meth:`release` them once the queue answered."""
        for key in plan.keys:
            self._inflight[key] = self._inflight.get(key, 0) + 1

    def release(self, plan: Plan) -> None:
        """Undo :meth:`reserve` (call under :attr:`lock`, before :meth:`commit`)."""
        for key in plan.keys:
            left = self._inflight.get(key, 0) - 1
            if left > 0:
                self._inflight[key] = left
            else:
                self._inflight.pop(key, None)

    def commit(self, plan: Plan) -> list[Skipped]:
        """Apply ``plan`` (its ready candidates were queued): remember its spans, hold its
        candidates, mark chosen roots; then enforce the bounds. Returns the skipped spans of
        traces decided by this request (to count). Call under :attr:`lock`."""
        now = self.clock()
        for span in plan.spans:
            trace = self._traces.get(span.trace_id)
            if trace is None:
                trace = self._traces[span.trace_id] = _Trace(now, now)
            if span.span_id in trace.parents:
                continue
            trace.parents[span.span_id] = span.parent_span_id
            self._spans += 1
            if trace.decided_at is None:
                trace.last = now
            if span.attributes.get(A.OPENINFERENCE_SPAN_KIND) == "RETRIEVER":
                self._add_documents(trace, span_documents(span.attributes))
        for candidate in plan.hold:
            trace = self._traces[candidate.span.trace_id]
            if candidate.convention == "genai-events" and trace.pending_since is None:
                trace.pending_since = now
            # held without its attributes (its texts and own documents are taken): an embedding
            # vector or a 16 MiB attribute is not held past its request
            candidate.contexts = candidate.contexts or self._trace_documents(None, span_documents(candidate.span.attributes))
            candidate.span = _light(candidate.span)
            trace.open[candidate.span.span_id] = candidate
            trace.chars += _candidate_chars(candidate)
            self._chars += _candidate_chars(candidate)
            if trace.decided_at is not None:  # a late candidate reopens its trace's window
                trace.decided_at = None
                trace.first = trace.last = now
        for skipped in plan.skipped:  # the attribute keys are kept for the log line, not the values
            self._traces[skipped.span.trace_id].skipped[skipped.span.span_id] = Skipped(
                _light(skipped.span, keys=True), skipped.source, skipped.reason, skipped.run
            )
        out: list[Skipped] = []
        for candidate in plan.ready:
            trace = self._traces[candidate.span.trace_id]
            trace.root_chosen = True
            trace.chosen.add(candidate.span.span_id)
        for trace_id in {c.span.trace_id for c in plan.ready}:
            trace = self._traces[trace_id]
            memo: dict[str, bool] = {}
            covered = [c for c in trace.open.values() if self._covered(trace, c.span.parent_span_id, trace.chosen, memo)]
            for candidate in covered:
                del trace.open[candidate.span.span_id]
                trace.chars -= _candidate_chars(candidate)
                self._chars -= _candidate_chars(candidate)
            plan.outcomes[COVERED] = plan.outcomes.get(COVERED, 0) + len(covered)
            if not trace.open:
                self._decided(trace, now)
        for trace_id in {s.span.trace_id for s in plan.skipped} | {c.span.trace_id for c in plan.ready}:
            trace = self._traces[trace_id]
            if trace.decided_at is not None:  # skipped spans of a decided trace are reported now
                out.extend(self._uncovered_skipped(trace))
        for outcome, n in plan.outcomes.items():
            self._count(outcome, n)
        return out

    def _trace_documents(self, trace: Optional[_Trace], more: list[str]) -> Optional[list[str]]:
        """The documents retrieved in a trace so far and in this request, capped."""
        from ..tracing.extraction import cap_contexts

        documents = (trace.documents if trace is not None else []) + more
        return cap_contexts(documents, self.max_documents, self.max_document_chars) if documents else None

    # ------------------------------------------------------------------ decisions

    def due(self, everything: bool = False) -> tuple[list[Candidate], list[Skipped]]:
        """Decide the traces whose window ended (every open trace with ``everything``): their
        outermost held candidates (contexts from the trace's documents when they have none),
        and their skipped spans that no chosen candidate covers or is nested in; then forget
        the traces remembered past ``remember`` and enforce the bounds. Call under :attr:`lock`.
        The caller queues the candidates and may :meth:`reopen` them when the queue refuses."""
        now = self.clock()
        chosen: list[Candidate] = []
        skipped: list[Skipped] = []
        for trace in list(self._traces.values()):
            pending_due = trace.pending_since is not None and now - trace.pending_since >= self.max_pending_hold
            if trace.decided_at is None and (everything or now - trace.last >= self.wait or now - trace.first >= self.max_hold or pending_due):
                found, lost = self._decide(trace, now, WINDOW)
                chosen += found
                skipped += lost
        self._expire(now)
        more, lost = self._enforce(now)
        return chosen + more, skipped + lost

    def reopen(self, candidates: list[Candidate]) -> None:
        """Hold ``candidates`` again (the queue refused them): they are chosen again when their
        trace's window ends anew, or early at a bound."""
        now = self.clock()
        for candidate in candidates:
            trace = self._traces.get(candidate.span.trace_id)
            if trace is None:
                trace = self._traces[candidate.span.trace_id] = _Trace(now, now)
                trace.parents[candidate.span.span_id] = candidate.span.parent_span_id
                self._spans += 1
            trace.chosen.discard(candidate.span.span_id)
            trace.open[candidate.span.span_id] = candidate
            trace.chars += _candidate_chars(candidate)
            self._chars += _candidate_chars(candidate)
            trace.decided_at = None
            trace.first = trace.last = now

    def _decide(self, trace: _Trace, now: float, outcome: str) -> tuple[list[Candidate], list[Skipped]]:
        open_ids = set(trace.open)
        marks = trace.chosen | open_ids
        memo: dict[str, bool] = {}
        outer = [c for c in trace.open.values() if not self._covered(trace, c.span.parent_span_id, marks, memo)]
        covered = len(trace.open) - len(outer)
        # a candidate with a scored span nested in it came late: that call was scored already
        ancestors = self._ancestors(trace.parents, trace.chosen)
        late = [c for c in outer if c.span.span_id in ancestors]
        chosen = [c for c in outer if c.span.span_id not in ancestors]
        if (
            len(chosen) > 1
            and not trace.chosen
            and any(s.run and not s.span.parent_span_id for s in trace.skipped.values())
        ):
            # the trace's root is an agent run that does not read (OpenAI Agents' holds no
            # input): its last text-producing call is its answer; the earlier ones are steps
            last = max(chosen, key=lambda c: (c.span.end_ns, c.span.start_ns))
            covered += len(chosen) - 1
            chosen = [last]
        uncaptured = {s.span.span_id for s in trace.skipped.values() if s.reason == CONTENT_NOT_CAPTURED}
        dropped = []
        if uncaptured and any(c.convention == "genai-events" for c in chosen):
            inside: dict[str, bool] = {}
            dropped = [c for c in chosen if c.convention == "genai-events" and self._covered(trace, c.span.parent_span_id, uncaptured, inside)]
            chosen = [c for c in chosen if c not in dropped]
        for candidate in chosen:
            if not candidate.contexts:
                candidate.contexts = self._trace_documents(trace, [])
        for candidate in trace.open.values():
            self._chars -= _candidate_chars(candidate)
        trace.open.clear()
        trace.chosen.update(c.span.span_id for c in chosen)
        self._decided(trace, now)
        self._count(outcome, len(chosen))
        self._count(LATE, len(late))
        self._count(COVERED, covered)
        self._count(UNCAPTURED, len(dropped))
        return chosen, self._uncovered_skipped(trace)

    def _decided(self, trace: _Trace, now: float) -> None:
        """Mark ``trace`` decided: only its span ids and chosen ids are remembered (its held
        documents are let go: a late call in it takes those of its own request)."""
        self._chars -= sum(len(d) for d in trace.documents)
        trace.documents = []
        trace.chars = 0
        trace.decided_at = now
        trace.pending_since = None

    def _covered(self, trace: _Trace, span_id: str, marks: set[str], memo: dict[str, bool]) -> bool:
        """Whether ``span_id`` or an ancestor is in ``marks``; a walk ending at a span never
        received is covered when the trace's root was chosen (it holds the whole trace)."""
        path, on_path = [], set()
        node, result = span_id, False
        while True:
            if not node:
                break
            if node in memo:
                result = memo[node]
                break
            if node in marks:
                result = True
                break
            if node in on_path or node not in trace.parents:
                result = node not in on_path and trace.root_chosen
                break
            on_path.add(node)
            path.append(node)
            node = trace.parents[node]
        for visited in path:
            memo[visited] = result
        return result

    def _ancestors(self, parents: Mapping[str, str], span_ids: Iterable[str]) -> set[str]:
        """Every ancestor id of ``span_ids`` by ``parents`` (span id -> parent id; the last one
        of a chain may be a span never received); each span walked once."""
        out: set[str] = set()
        for span_id in span_ids:
            node = parents.get(span_id, "")
            while node and node not in out:
                out.add(node)
                node = parents.get(node, "")
        return out

    def _uncovered_skipped(self, trace: _Trace) -> list[Skipped]:
        if not trace.skipped:
            return []
        memo: dict[str, bool] = {}
        ancestors = self._ancestors(trace.parents, trace.chosen)
        out = [s for s in trace.skipped.values() if s.span.span_id not in ancestors and not self._covered(trace, s.span.parent_span_id, trace.chosen, memo)]
        trace.skipped.clear()
        return out

    def _add_documents(self, trace: _Trace, documents: list[str]) -> None:
        room = self.max_document_chars + 1 - sum(len(d) for d in trace.documents)
        for text in documents:
            if len(trace.documents) >= self.max_documents or room <= 0:
                break
            text = text[:room]
            trace.documents.append(text)
            trace.chars += len(text)
            self._chars += len(text)
            room -= len(text)

    def _expire(self, now: float) -> None:
        for trace_id, trace in list(self._traces.items()):
            if trace.decided_at is not None and now - trace.decided_at >= self.remember:
                self._forget(trace_id)

    def _forget(self, trace_id: str) -> None:
        trace = self._traces.pop(trace_id)
        self._spans -= len(trace.parents)
        self._chars -= trace.chars

    def _enforce(self, now: float) -> tuple[list[Candidate], list[Skipped]]:
        """Within the bounds: forget the oldest decided traces, then decide the oldest open
        ones early (and forget them)."""
        chosen: list[Candidate] = []
        skipped: list[Skipped] = []
        while self._traces and (len(self._traces) > self.max_traces or self._spans > self.max_spans or self._chars > self.max_chars):
            decided = next((trace_id for trace_id, trace in self._traces.items() if trace.decided_at is not None), None)
            if decided is not None:
                self._forget(decided)
                continue
            trace_id, trace = next(iter(self._traces.items()))
            found, lost = self._decide(trace, now, EARLY)
            chosen += found
            skipped += lost
            self._forget(trace_id)
        return chosen, skipped

    def enforce(self) -> tuple[list[Candidate], list[Skipped]]:
        """:meth:`_enforce` now (after :meth:`commit`; call under :attr:`lock`)."""
        return self._enforce(self.clock())

    def _count(self, outcome: str, n: int) -> None:
        if n:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
            try:
                self.on_outcome(outcome, n)
            except Exception:  # a metrics failure never breaks the receiver
                pass
