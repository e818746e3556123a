"""Batch scoring: score a dataset of (question, answer) pairs and summarise it.

Uses ``relevancy_tracer.evaluate`` (concurrent, results in row order) on WikiEval's complete
and poor answers and prints a pandas summary; the same is available without code as
``relevancy-tracer score FILE -o OUT``.

Run::

    python examples/batch_scoring.py ../shared/data/wikieval_dev.jsonl --limit 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import relevancy_tracer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="JSONL with question, answer and poor_answer fields")
    parser.add_argument("--limit", type=int, default=None, help="first N rows only")
    parser.add_argument("--out", type=Path, default=None, help="write per-row scores to this CSV")
    args = parser.parse_args()

    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()][: args.limit]
    pairs = [{"question": r["question"], "answer": r[kind], "kind": kind} for r in rows for kind in ("answer", "poor_answer")]
    frame = relevancy_tracer.evaluate(pairs, as_dataframe=True)
    frame["kind"] = [p["kind"] for p in pairs]
    print(frame.groupby("kind")["score"].describe()[["count", "mean", "min", "max"]].round(3).to_string())
    good = frame[frame.kind == "answer"]["score"].to_numpy()
    poor = frame[frame.kind == "poor_answer"]["score"].to_numpy()
    print(f"\ncomplete answer scored above the poor one in {(good > poor).mean():.0%} of {len(good)} rows")
    print("statuses:", frame["status"].value_counts().to_dict())
    if args.out:
        frame.to_csv(args.out, index=False)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
