"""Follow-up turns judged in their conversation: the default on multi-turn RAG conversations.

Data: ``multiturn_dev.jsonl`` (``$RELEVANCY_TRACER_SHARED/data``, default ``../shared/data``;
MT-RAG's human conversations, see its README_devsets.md; MT-RAG's and MTRAG-UN's other
conversations are reserved for independent evaluation and never read here). Each row is a turn
(2nd user turn or later) with its earlier turns, the turn's reference answer (relevant in its
conversation) and, as a control, the reference answer of an earlier turn of the same
conversation (on topic, not this question).

Configs:

* ``last_turn``: the question is the last user turn alone (what every path did before the
  conversation was read);
* ``history``: the earlier turns are given (``score(question, answer, history=...)``): the last
  turn is rewritten as a standalone question and the answer judged against it;
* ``rewrite``: the benchmark's own standalone rewrite as the question, no history (a reference:
  a perfect rewrite without the conversation).

Reported per group of turns (all, self-contained, context-dependent: the set's
``context_dependent`` flag): the right answer's mean calibrated score, its share labelled
``does_not_address``, and the share of turns where the right answer outscores the earlier
turn's answer (ties count half), each with a 95% bootstrap interval over conversations (2,000
resamples); the failure kinds of right answers below ``directly_addresses``; chat requests and
seconds per evaluation. Records are appended as they finish (resumable)::

    OMP_WAIT_POLICY=PASSIVE flock /tmp/relevancy-model.lock python -m benchmarks.multiturn --configs last_turn,history
    python -m benchmarks.multiturn --report-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relevancy_tracer.config import Settings  # noqa: E402
from relevancy_tracer.scoring.calibration import bootstrap_interval  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = ("last_turn", "history", "rewrite")
GROUPS = ("all", "self_contained", "context_dependent")


def data_dir() -> Path:
    shared = os.environ.get("RELEVANCY_TRACER_SHARED")
    return Path(shared) / "data" if shared else Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def load_rows(path: Optional[Path] = None) -> list[dict]:
    path = path or data_dir() / "multiturn_dev.jsonl"
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def row_key(row: dict) -> str:
    return f"{row['conversation_id']}:{row['turn']}"


def per_conversation(rows: list[dict], k: int) -> list[dict]:
    """At most ``k`` turns of each conversation, the first ``k`` in a fixed hash order of their keys."""
    import hashlib

    ranked = sorted(rows, key=lambda r: hashlib.sha256(row_key(r).encode()).hexdigest())
    kept: dict[str, int] = {}
    chosen = set()
    for row in ranked:
        if kept.get(row["conversation_id"], 0) < k:
            kept[row["conversation_id"]] = kept.get(row["conversation_id"], 0) + 1
            chosen.add(row_key(row))
    return [r for r in rows if row_key(r) in chosen]


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    latest: dict[tuple, dict] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                latest[(record["config"], record["key"], record["cand"])] = record
    return list(latest.values())


def inputs(row: dict, config: str, cand: str) -> tuple[str, str, Any]:
    answer = row["answer"] if cand == "answer" else row["distractor_answer"]
    if config == "history":
        return row["question"], answer, row["history"]
    if config == "rewrite":
        return row["standalone_question"], answer, None
    return row["question"], answer, None


def run(engine: Any, config: str, rows: list[dict], records: Path, concurrency: int, candidates: tuple[str, ...] = ("answer", "distractor")) -> None:
    done = {(r["key"], r["cand"]) for r in read_records(records) if r["config"] == config and r["status"] == "scored"}
    todo = [(row, cand) for row in rows for cand in candidates if (row_key(row), cand) not in done]
    print(f"== {config}: {len(todo)} evaluations to run", flush=True)
    if not todo:
        return
    started = time.perf_counter()
    finished = 0

    async def one(row: dict, cand: str, limit: asyncio.Semaphore, out: Any) -> None:
        nonlocal finished
        question, answer, history = inputs(row, config, cand)
        async with limit:
            t0 = time.perf_counter()
            result = await engine.ascore(question, answer, history=history)
            seconds = time.perf_counter() - t0
        record = {
            "config": config,
            "key": row_key(row),
            "conversation_id": row["conversation_id"],
            "turn": row["turn"],
            "context_dependent": row.get("context_dependent"),
            "cand": cand,
            "status": result.status,
            "error": result.error,
            "score": result.score,
            "raw": result.raw_score,
            "evidence": result.evidence,
            "label": result.label,
            "failure_kind": result.failure_kind,
            "components": result.components,
            "standalone_question": result.standalone_question,
            "history_turns": result.history_turns,
            "llm_calls": result.llm_calls,
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "seconds": seconds,
            "evaluator_version": result.evaluator_version,
        }
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        finished += 1
        eta = (time.perf_counter() - started) / finished * (len(todo) - finished) / 60
        print(f"  [{finished}/{len(todo)}] {record['key'][-12:]} {cand:10s} {result.status} score={record['score'] if record['score'] is None else round(record['score'], 3)} {result.label} {seconds:.1f}s eta {eta:.0f} min", flush=True)

    async def main() -> None:
        limit = asyncio.Semaphore(concurrency)
        with open(records, "a", encoding="utf-8") as out:
            await asyncio.gather(*(one(row, cand, limit, out) for row, cand in todo))

    asyncio.run(main())


def _in_group(record: dict, group: str) -> bool:
    if group == "all":
        return True
    return record["context_dependent"] is not None and record["context_dependent"] == (group == "context_dependent")


def _ci(values: np.ndarray, groups: list[str]) -> list[float]:
    low, high = bootstrap_interval(lambda idx: float(np.mean(values[idx])), len(values), groups=groups)
    return [round(low, 3), round(high, 3)]


def report(records: list[dict], rows: list[dict]) -> dict[str, Any]:
    """Per config and group: right answers' mean score, share ``does_not_address``, pairwise
    wins over the earlier turn's answer (each with its interval over conversations), failure
    kinds, cost."""
    keys = {row_key(r) for r in rows}
    out: dict[str, Any] = {}
    by_config: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for record in records:
        if record["key"] in keys:
            by_config[record["config"]][(record["key"], record["cand"])] = record
    for config, found in sorted(by_config.items()):
        config_report: dict[str, Any] = {}
        for group in GROUPS:
            rights = [found[(row_key(row), "answer")] for row in rows if (row_key(row), "answer") in found and _in_group(found[(row_key(row), "answer")], group)]
            scored_rights = [a for a in rights if a["status"] == "scored"]
            if not scored_rights:
                continue
            convs = [a["conversation_id"] for a in scored_rights]
            score = np.array([a["score"] for a in scored_rights])
            dna = np.array([a["label"] == "does_not_address" for a in scored_rights], dtype=float)
            others = {a["key"]: found.get((a["key"], "distractor")) for a in scored_rights}
            scored = [(a, others[a["key"]]) for a in scored_rights if others[a["key"]] is not None and others[a["key"]]["status"] == "scored"]
            config_report[group] = {
                "turns": len(scored_rights),
                "conversations": len(set(convs)),
                "failed": len(rights) - len(scored_rights),
                "right_mean_score": round(float(score.mean()), 3),
                "right_mean_score_ci": _ci(score, convs),
                "right_does_not_address": round(float(dna.mean()), 3),
                "right_does_not_address_ci": _ci(dna, convs),
                "right_does_not_address_count": int(dna.sum()),
                "right_labels": dict(Counter(a["label"] for a in scored_rights)),
                "right_failure_kinds": dict(Counter(a["failure_kind"] for a in scored_rights if a["failure_kind"])),
            }
            if scored and len(scored) == len(scored_rights):  # the comparison only where every turn has its pair
                wins = np.array([1.0 if a["score"] > b["score"] else 0.5 if a["score"] == b["score"] else 0.0 for a, b in scored])
                config_report[group].update(
                    pairs=len(scored),
                    earlier_answer_labels=dict(Counter(b["label"] for _, b in scored)),
                    earlier_answer_failure_kinds=dict(Counter(b["failure_kind"] for _, b in scored if b["failure_kind"])),
                    pairwise=round(float(wins.mean()), 3),
                    pairwise_ci=_ci(wins, [a["conversation_id"] for a, _ in scored]),
                )
        every = [r for r in found.values() if r["status"] == "scored"]
        config_report["cost"] = {
            "evaluations": len(every),
            "llm_calls_mean": round(float(np.mean([r["llm_calls"] for r in every])), 2),
            "input_tokens_mean": round(float(np.mean([r["input_tokens"] for r in every])), 1),
            "seconds_mean": round(float(np.mean([r["seconds"] for r in every])), 2),
        }
        out[config] = config_report
    return out


def markdown(reports: dict[str, Any]) -> str:
    lines = [
        "| config | turns | right answer: mean score | right answer `does_not_address` | right answer outscores the earlier turn's answer |",
        "| --- | --- | --- | --- | --- |",
    ]
    for config, config_report in reports.items():
        for group in GROUPS:
            r = config_report.get(group)
            if r:
                lines.append(
                    f"| {config} | {group.replace('_', '-')} ({r['turns']}) | {r['right_mean_score']:.2f} [{r['right_mean_score_ci'][0]:.2f}, {r['right_mean_score_ci'][1]:.2f}] "
                    f"| {r['right_does_not_address_count']} of {r['turns']} ({r['right_does_not_address']:.0%}) "
                    + (f"| {r['pairwise']:.2f} [{r['pairwise_ci'][0]:.2f}, {r['pairwise_ci'][1]:.2f}] |" if "pairwise" in r else "| not measured |")
                )
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="last_turn,history")
    parser.add_argument("--data", type=Path, default=None, help="a multi-turn JSONL file of the same fields (default: multiturn_dev.jsonl)")
    parser.add_argument("--records", type=Path, default=RESULTS / "multiturn_records.jsonl")
    parser.add_argument("--out", type=Path, default=RESULTS / "multiturn.json")
    parser.add_argument("--concurrency", type=int, default=Settings.concurrency)
    parser.add_argument("--limit", type=int, default=None, help="first N rows only")
    parser.add_argument("--per-conversation", type=int, default=None, help="at most K turns of each conversation (its first K in a fixed hash order): a subset that still spans every conversation")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--candidates", default="answer,distractor", help="which answers of each turn to score: answer (the turn's reference), distractor (an earlier turn's)")
    parser.add_argument("--llm", default="local")
    parser.add_argument("--embeddings", default="local")
    parser.add_argument("--in-process", action="store_true", help="run the local models in this process, not the shared model host (whose SCHED_IDLE priority starves on a busy machine)")
    args = parser.parse_args(argv)
    rows = load_rows(args.data)[: args.limit]
    if args.per_conversation:
        rows = per_conversation(rows, args.per_conversation)
    if not args.report_only:
        from relevancy_tracer.scoring.engine import Engine

        engine = Engine(Settings.resolve(llm=args.llm, embeddings=args.embeddings, **({"local_host": False} if args.in_process else {})))
        engine.score("Warm-up question?", "Warm-up answer.")
        for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
            if config not in CONFIGS:
                parser.error(f"unknown config {config!r} (one of {', '.join(CONFIGS)})")
            run(engine, config, rows, args.records, args.concurrency, tuple(args.candidates.split(",")))
    reports = report(read_records(args.records), rows)
    print(markdown(reports))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data = {"data": (args.data.name if args.data else "multiturn_dev.jsonl"), "rows": len(rows), "per_conversation": args.per_conversation, "reports": reports}
    args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
