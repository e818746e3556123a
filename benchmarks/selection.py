"""Span selection of the scoring service: time to select the outermost candidates of one export
request as its size grows, the figure behind "selection is linear in the number of spans".

Two shapes, each in one trace: ``roots`` (N root CHAIN spans and one RETRIEVER span: every root
is a candidate and takes the retriever's documents as contexts) and ``chain`` (N CHAIN spans each
the child of the previous one: only the top one is kept). Reported: seconds per size (best of
``--repeat``) and the ratio of the largest to the smallest size against the ratio of their span
counts (1.0 = linear).

    python -m benchmarks.selection                      # 1k, 2k, 4k, 8k, 100k spans
    python -m benchmarks.selection --sizes 1000,8000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from relevancy_tracer.service.otlp import ReceivedSpan
from relevancy_tracer.service.selection import SpanSelector

from benchmarks._paths import ROOT

TRACE = "ab" * 16


def roots(n: int) -> list[ReceivedSpan]:
    spans = [ReceivedSpan(TRACE, f"{i + 1:016x}", "", "answer", 1, {"openinference.span.kind": "CHAIN", "input.value": f"q{i}?", "output.value": f"a{i}."}) for i in range(n)]
    return spans + [ReceivedSpan(TRACE, "f" * 16, "", "retrieve", 1, {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.content": "a document"})]


def chain(n: int) -> list[ReceivedSpan]:
    return [ReceivedSpan(TRACE, f"{i + 1:016x}", f"{i:016x}" if i else "", "step", 1, {"openinference.span.kind": "CHAIN", "input.value": f"q{i}?", "output.value": f"a{i}."}) for i in range(n)]


def timed(spans: list[ReceivedSpan], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        SpanSelector().select(spans)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,2000,4000,8000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "selection.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict = {"sizes": sizes, "seconds": {}}
    print("| shape | " + " | ".join(f"{n:,} spans" for n in sizes) + f" | time ratio {sizes[-1]:,}/{sizes[0]:,} | span ratio |")
    print("| --- |" + " ---: |" * (len(sizes) + 2))
    for name, build in (("roots", roots), ("chain", chain)):
        seconds = [timed(build(n), args.repeat) for n in sizes]
        results["seconds"][name] = seconds
        print(f"| {name} | " + " | ".join(f"{s:.3f} s" for s in seconds) + f" | {seconds[-1] / seconds[0]:.1f}x | {sizes[-1] / sizes[0]:.0f}x |")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
