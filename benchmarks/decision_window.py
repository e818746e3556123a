"""Memory of `serve`'s decision window at its default bounds: the figure behind "the window's
memory is bounded" in docs/service.md.

``--traces`` (12,000, past the default ``decision_max_traces`` of 10,000) traces arrive one export
request each, 1 ms apart (so none is decided by time): an LLM call (a question and an answer of
about 1,000 characters each, and a 1 MB attribute the window must not keep) under an app span,
and a RETRIEVER span with 5 documents of 2,000 characters. The window is built as
``relevancy_tracer.service.scoring_service`` builds it, from the default settings. Reported: the
traces and characters held once every request is in, the traces decided early to stay within
the bounds, and the Python memory the window holds (``tracemalloc``: held at the end, and peak).
No model, no server; about 10 s.

    python -m benchmarks.decision_window
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path

from benchmarks._paths import ROOT

QUESTION_CHARS = 1_000
ANSWER_CHARS = 1_000
DOCUMENTS = 5
DOCUMENT_CHARS = 2_000
IGNORED_BYTES = 1_000_000


def measure(traces: int) -> dict:
    """Feed ``traces`` traces through a default-sized window; the figures of the module docstring."""
    from relevancy_tracer.config import Settings
    from relevancy_tracer.service.decision import DecisionWindow
    from relevancy_tracer.service.otlp import ReceivedSpan
    from relevancy_tracer.service.selection import SpanSelector

    s = Settings.resolve()
    now = [0.0]
    big = "x" * IGNORED_BYTES

    def window_of_the_service() -> DecisionWindow:
        return DecisionWindow(s.decision_wait, s.decision_max_traces, 20 * s.decision_max_traces, 4 * s.max_request_bytes, max_documents=s.max_contexts, max_document_chars=s.max_context_chars, max_pending_hold=s.join_ttl / 2, clock=lambda: now[0])

    def request(i: int) -> list[ReceivedSpan]:
        trace = f"{i + 1:032x}"
        documents = {f"retrieval.documents.{d}.document.content": f"doc {d} " + "d" * DOCUMENT_CHARS for d in range(DOCUMENTS)}
        return [
            ReceivedSpan(trace, "a" * 16, "f" * 16, "llm", 1, {"openinference.span.kind": "LLM", "input.value": f"question {i} " + "q" * QUESTION_CHARS, "output.value": "answer " + "a" * ANSWER_CHARS, "llm.embedding": big}),
            ReceivedSpan(trace, "b" * 16, "f" * 16, "retrieve", 1, {"openinference.span.kind": "RETRIEVER", **documents}),
        ]

    def feed(window: DecisionWindow, spans: list[ReceivedSpan]) -> int:
        candidates, skipped = SpanSelector().classify(spans)
        with window.lock:
            window.commit(window.plan(spans, candidates, skipped))
            early, _ = window.enforce()
        return len(early)

    feed(window_of_the_service(), request(0))  # lazy imports and caches outside the measurement
    text_chars = sum(len(v) for span in request(0) for k, v in span.attributes.items() if k != "llm.embedding" and k != "openinference.span.kind")
    decided_early = 0
    tracemalloc.start()
    try:
        window = window_of_the_service()
        for i in range(traces):
            decided_early += feed(window, request(i))
            now[0] += 0.001
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "traces": traces,
        "text_chars_per_trace": text_chars,
        "ignored_attribute_bytes": IGNORED_BYTES,
        "bounds": {"max_traces": window.max_traces, "max_spans": window.max_spans, "max_chars": window.max_chars},
        "traces_held": len(window),
        "candidates_held": window.held(),
        "decided_early": decided_early,
        "chars_held": window.chars,
        "spans_remembered": window.spans,
        "mib_held": held / 2**20,
        "mib_peak": peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=12_000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decision_window.json"))
    args = parser.parse_args()
    results = measure(args.traces)
    print(f"{results['traces']:,} traces fed: {results['traces_held']:,} held ({results['candidates_held']:,} candidates, {results['chars_held']:,} characters of {results['bounds']['max_chars']:,}), {results['decided_early']:,} decided early; {results['mib_held']:.0f} MiB held, peak {results['mib_peak']:.0f} MiB")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
