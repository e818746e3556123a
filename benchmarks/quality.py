"""Quality of every relevancy method on WikiEval (../shared/data/wikieval_dev.jsonl).

For each method (and generation mode for the question-generating ones) every row's three
candidates are scored with the configured models (default: the embedded local models):
``answer`` (complete), ``poor_answer`` (incomplete or padded) and ``ungrounded_answer``
(complete but not grounded in the context: as relevant as ``answer``, since relevancy does not
judge facts). Reported per configuration:

* pairwise accuracy: share of rows where score(answer) > score(poor_answer) (ties count as
  misses), the metric of the RAGAS paper (which reports 0.78 for its answer relevance with
  gpt-3.5 and ada-002); and, separately, score(ungrounded_answer) > score(poor_answer);
* mean score of each candidate (the spread matters for drift alerting);
* seconds, LLM calls, input and output tokens per evaluation; failed evaluations.

The noncommittal rules (all / any / per_question) are recomputed from the same generated
questions, flags and similarities, so they cost no extra model calls; weighted combinations of
components are likewise derived from the component runs ("derived" rows, whose cost is the sum
of their components'). Methods named in ``--methods`` are run for real; with ``--reuse FILE``
the records of every other configuration in an earlier results file are kept and summarised
again, so one changed method is rerun without rerunning the rest.

Usage::

    python benchmarks/quality.py                       # every method, local models
    python benchmarks/quality.py --methods ragas_direct --out benchmarks/results/default.json
    python benchmarks/quality.py --rows 3 --methods direct   # quick look
    python benchmarks/quality.py --methods intent,ragas_intent --reuse benchmarks/results/quality.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from relevancy_tracer.config import Settings  # noqa: E402
from relevancy_tracer.scoring.engine import Engine  # noqa: E402
from relevancy_tracer.scoring.methods import apply_noncommittal  # noqa: E402

CANDIDATES = ("answer", "poor_answer", "ungrounded_answer")
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "wikieval_dev.jsonl"


def load_rows(path: Path, limit: Optional[int]) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def run_config(engine: Engine, rows: list[dict], overrides: dict) -> list[dict]:
    """Score every candidate of every row; one record per (row, candidate)."""
    records = []
    for index, row in enumerate(rows):
        for candidate in CANDIDATES:
            started = time.perf_counter()
            result = engine.score(row["question"], row[candidate], row.get("contexts"), **overrides)
            records.append(
                {
                    "row": index,
                    "candidate": candidate,
                    "status": result.status,
                    "error": result.error,
                    "score": result.score,
                    "components": result.components,
                    "similarities": result.similarities,
                    "noncommittal": result.noncommittal,
                    "generated_questions": result.generated_questions,
                    "seconds": time.perf_counter() - started,
                    "llm_calls": result.llm_calls,
                    "input_tokens": result.input_tokens,
                    "output_tokens": result.output_tokens,
                }
            )
            print(f"  row {index} {candidate:17s} {result.status:12s} score={result.score if result.score is None else round(result.score, 3)} {time.perf_counter() - started:5.1f}s", flush=True)
    return records


def summarise(name: str, records: list[dict], score_of: Any = None, derived: bool = False) -> dict:
    """Accuracy, means and costs of one configuration's records."""
    score_of = score_of or (lambda r: r["score"])
    table: dict[tuple, Optional[float]] = {(r["row"], r["candidate"]): (score_of(r) if r["status"] == "scored" else None) for r in records}
    rows = sorted({r["row"] for r in records})

    def accuracy(better: str, worse: str) -> float:
        wins = [table[(i, better)] is not None and table[(i, worse)] is not None and table[(i, better)] > table[(i, worse)] for i in rows]
        return float(np.mean(wins))

    def mean(candidate: str) -> Optional[float]:
        values = [table[(i, candidate)] for i in rows if table[(i, candidate)] is not None]
        return float(np.mean(values)) if values else None

    evaluations = len(records)
    return {
        "config": name,
        "derived": derived,
        "accuracy": accuracy("answer", "poor_answer"),
        "ungrounded_vs_poor": accuracy("ungrounded_answer", "poor_answer"),
        "mean_answer": mean("answer"),
        "mean_poor": mean("poor_answer"),
        "mean_ungrounded": mean("ungrounded_answer"),
        "seconds_per_eval": sum(r["seconds"] for r in records) / evaluations,
        "llm_calls_per_eval": sum(r["llm_calls"] for r in records) / evaluations,
        "input_tokens_per_eval": sum(r["input_tokens"] for r in records) / evaluations,
        "output_tokens_per_eval": sum(r["output_tokens"] for r in records) / evaluations,
        "failures": sum(1 for r in records if r["status"] != "scored"),
        "rows": len(rows),
    }


def noncommittal_variants(name: str, records: list[dict]) -> list[dict]:
    out = []
    for rule in ("all", "any", "per_question"):
        def score_of(r: dict, rule: str = rule) -> float:
            return apply_noncommittal(np.asarray(r["similarities"]), r["noncommittal"], rule)

        out.append(summarise(f"{name}, noncommittal={rule}", records, score_of, derived=rule != "all"))
    return out


def combination(name: str, parts: dict[str, list[dict]], weights: dict[str, float]) -> dict:
    """A weighted combination derived from component runs (cost: the sum of the components)."""
    merged = []
    keyed = {part: {(r["row"], r["candidate"]): r for r in records} for part, records in parts.items()}
    first = next(iter(parts.values()))
    for base in first:
        key = (base["row"], base["candidate"])
        members = {part: keyed[part][key] for part in weights}
        ok = {p: m for p, m in members.items() if m["status"] == "scored"}
        total = sum(weights[p] for p in ok)
        merged.append(
            {
                "row": key[0],
                "candidate": key[1],
                "status": "scored" if ok else "failed",
                "score": sum(weights[p] * ok[p]["score"] for p in ok) / total if ok else None,
                "seconds": sum(m["seconds"] for m in members.values()),
                "llm_calls": sum(m["llm_calls"] for m in members.values()),
                "input_tokens": sum(m["input_tokens"] for m in members.values()),
                "output_tokens": sum(m["output_tokens"] for m in members.values()),
            }
        )
    return summarise(name, merged, derived=True)


def markdown(summaries: list[dict]) -> str:
    lines = [
        "| method | pairwise accuracy | ungrounded > poor | mean good | mean poor | mean ungrounded | s/eval | LLM calls/eval | tokens in/out per eval | failures |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        name = s["config"] + (" (derived)" if s["derived"] else "")
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(
            f"| {name} | {s['accuracy']:.2f} | {s['ungrounded_vs_poor']:.2f} | {fmt(s['mean_answer'])} | {fmt(s['mean_poor'])} | {fmt(s['mean_ungrounded'])} "
            f"| {s['seconds_per_eval']:.1f} | {s['llm_calls_per_eval']:.1f} | {s['input_tokens_per_eval']:.0f} / {s['output_tokens_per_eval']:.0f} | {s['failures']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("--methods", default="ragas,direct,decomposition,intent,llm_similarity,combined", help="comma-separated methods to run")
    parser.add_argument("--generation", default="joint,independent", help="generation modes for ragas (comma-separated)")
    parser.add_argument("--llm", default="local")
    parser.add_argument("--embeddings", default="local")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "quality.json")
    parser.add_argument("--reuse", type=Path, default=None, help="keep the records of configurations not run now from this earlier results file")
    args = parser.parse_args()
    reused: dict[str, list[dict]] = json.loads(args.reuse.read_text(encoding="utf-8"))["runs"] if args.reuse else {}

    rows = load_rows(args.data, args.rows)
    engine = Engine(Settings.resolve(llm=args.llm, embeddings=args.embeddings))
    print(f"models: {engine.models.llm.name} + {engine.models.embedder.name}; {len(rows)} rows x {len(CANDIDATES)} candidates", flush=True)
    engine.score("Warm-up question?", "Warm-up answer.", method="direct")  # load models outside the timings

    runs: dict[str, list[dict]] = {}
    summaries: list[dict] = []
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        modes = [g.strip() for g in args.generation.split(",")] if method == "ragas" else [None]
        for mode in modes:
            overrides: dict[str, Any] = {"method": method}
            name = method
            if mode:
                overrides["generation"] = mode
                name = f"ragas, generation={mode}"
            print(f"== {name}", flush=True)
            records = run_config(engine, rows, overrides)
            key = method if mode in (None, "joint") else f"{method}-{mode}"
            runs[key] = records
            if method == "ragas":
                summaries.extend(noncommittal_variants(name, records))
            else:
                summaries.append(summarise(name, records))

    for key, records in reused.items():
        if key in runs:
            continue
        runs[key] = records
        method, _, mode = key.partition("-")
        name = f"ragas, generation={mode or 'joint'}" if method == "ragas" else method
        summaries.extend(noncommittal_variants(name, records) if method == "ragas" else [summarise(name, records)])

    if {"ragas", "direct"} <= set(runs):
        summaries.append(combination("ragas + direct (0.5/0.5)", runs, {"ragas": 0.5, "direct": 0.5}))
    if {"ragas", "direct", "decomposition", "intent"} <= set(runs):
        summaries.append(combination("seed weights, from components", runs, {"ragas": 0.3, "direct": 0.25, "decomposition": 0.25, "intent": 0.2}))
    if {"ragas", "direct", "decomposition"} <= set(runs):
        summaries.append(combination("ragas + direct + decomposition (1/3 each)", runs, {"ragas": 1, "direct": 1, "decomposition": 1}))

    if {"ragas", "intent"} <= set(runs):
        # The ragas share of the default `ragas_intent`, swept over the component runs.
        for weight in (0.1, 0.2, 0.3, 0.5):
            summaries.append(combination(f"ragas {weight} + intent {1 - weight:.1f}, from components", runs, {"ragas": weight, "intent": 1 - weight}))

    table = markdown(summaries)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"models": [engine.models.llm.name, engine.models.embedder.name], "rows": len(rows), "summaries": summaries, "runs": runs, "cpu_count": os.cpu_count()}, indent=1, default=str))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
