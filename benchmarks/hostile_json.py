"""CPU seconds per request byte of `serve`'s receiving path (issue 35, item 1): protobuf decode,
attributes cut to the content budgets, span reading (:meth:`SpanSelector.classify`) and the
decision window, for export requests whose ``input.value`` / ``output.value`` are JSON of hostile
shapes, against a request of the same size holding plain text.

Each request: ``--spans`` (20) root CHAIN spans, both values ``--chars`` (32,000) characters:
``plain`` text; ``nested_object`` ``{"input": {"input": ...`` nested as deep as it fits (the
shape that cost 6.4 s of CPU per span on main 4e0a83f: re-serialised at every level);
``nested_dict`` ``{"a": {"b": ...``; ``nested_messages`` ``{"messages": [{"messages": [...``;
``brackets`` ``[[[[...`` past the parser's recursion limit; ``wide`` an object of 2,000
fields. Reported: CPU seconds per MB (best of ``--repeat``) and the ratio to ``plain``.

    python -m benchmarks.hostile_json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks._paths import ROOT


def value(shape: str, chars: int) -> str:
    depth = chars // 6 + 1
    text = {
        "plain": ("Where is Lyon? " * (chars // 15 + 1)),
        "nested_object": '{"input": ' * depth + '"x"' + "}" * depth,
        "nested_dict": '{"a": {"b": ' * depth + '"x"' + "}}" * depth,
        "nested_messages": '{"messages": [' * depth + '"x"' + "]}" * depth,
        "brackets": "[" * chars,
        "wide": json.dumps({f"field{i}": f"value {i}" for i in range(2000)}),
    }[shape]
    return text[:chars]


def request(shape: str, spans: int, chars: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    kv = lambda k, v: common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))  # noqa: E731
    text = value(shape, chars)
    items = [trace_pb2.Span(trace_id=os.urandom(16), span_id=os.urandom(8), name="answer", attributes=[kv("openinference.span.kind", "CHAIN"), kv("input.value", text), kv("input.mime_type", "application/json"), kv("output.value", text), kv("output.mime_type", "application/json")]) for _ in range(spans)]
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=items)])]).SerializeToString()


def cpu_per_request(body: bytes, repeat: int) -> float:
    """Best CPU seconds of receiving ``body`` (everything before queueing)."""
    from relevancy_tracer.config import Settings
    from relevancy_tracer.service.decision import DecisionWindow
    from relevancy_tracer.service.otlp import parse_request, spans_of
    from relevancy_tracer.service.selection import SpanSelector

    s = Settings.resolve()
    max_text_chars = max(s.max_question_chars, s.max_answer_chars, s.max_context_chars, s.max_content_chars) + 1
    best = float("inf")
    for _ in range(repeat):
        window = DecisionWindow(s.decision_wait, s.decision_max_traces, 20 * s.decision_max_traces, 4 * s.max_request_bytes)
        start = time.process_time()
        spans = spans_of(parse_request(body), max_text_chars)
        candidates, skipped = SpanSelector().classify(spans)
        with window.lock:
            window.commit(window.plan(spans, candidates, skipped))
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=20)
    parser.add_argument("--chars", type=int, default=32_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hostile_json.json"))
    args = parser.parse_args()
    results: dict = {"spans": args.spans, "chars": args.chars, "shapes": {}}
    print("| shape | request bytes | CPU s per request | CPU s per MB | x plain |")
    print("| --- | ---: | ---: | ---: | ---: |")
    plain = None
    for shape in ("plain", "nested_object", "nested_dict", "nested_messages", "brackets", "wide"):
        body = request(shape, args.spans, args.chars)
        seconds = cpu_per_request(body, args.repeat)
        per_mb = seconds / (len(body) / 1e6)
        plain = plain or per_mb
        results["shapes"][shape] = {"bytes": len(body), "cpu_seconds": seconds, "cpu_seconds_per_mb": per_mb, "ratio_to_plain": per_mb / plain}
        print(f"| {shape} | {len(body):,} | {seconds:.4f} | {per_mb:.4f} | {per_mb / plain:.1f} |")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
