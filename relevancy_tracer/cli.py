"""Command line: ``relevancy-tracer score`` (batch scoring) and ``relevancy-tracer demo``.

``score INPUT [-o OUTPUT]`` reads JSONL, CSV or Parquet, scores every row concurrently, and
writes one output row per input row, in input order: the input fields plus score, label,
explanation, method, components, generated_questions, similarities, noncommittal,
sub_questions, intent, status, error and usage. A progress bar and a summary (count, mean,
quantiles, label counts, failures by status) go to stderr. Bad rows never stop the run; Ctrl-C
writes every row finished so far and exits with status 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections import Counter
from typing import Any, Optional, Sequence

from .config import GENERATION_MODES, METHODS, NONCOMMITTAL_RULES, Settings
from .dataset import ColumnMapping, InputRow, RowWriter, read_rows
from .result import RelevancyResult, Status
from .scoring.engine import Engine, _sync_loop

OUTPUT_FIELDS = (
    "score",
    "label",
    "explanation",
    "method",
    "components",
    "failed_components",
    "generated_questions",
    "similarities",
    "noncommittal",
    "sub_questions",
    "sub_questions_addressed",
    "intent",
    "status",
    "error",
    "latency_ms",
    "input_tokens",
    "output_tokens",
    "llm_calls",
    "truncated",
)


def output_row(data: Optional[dict], result: RelevancyResult, line: int) -> dict:
    """The output record of one input row: input fields, then the result fields."""
    row = dict(data) if data else {"line": line}
    values = result.to_dict()
    for name in OUTPUT_FIELDS:
        row[name] = values.get(name)
    row["latency_ms"] = round(row["latency_ms"] or 0.0, 1)
    return row


def summarise(results: Sequence[RelevancyResult], unfinished: int = 0) -> dict:
    """Count, mean, quantiles, label counts and failures by status of ``results``."""
    import numpy as np

    scores = np.asarray([r.score for r in results if r.ok], dtype=float)
    summary: dict[str, Any] = {"rows": len(results) + unfinished, "scored": int(scores.size)}
    if scores.size:
        summary["mean"] = round(float(scores.mean()), 4)
        for q in (10, 25, 50, 75, 90):
            summary[f"p{q}"] = round(float(np.percentile(scores, q)), 4)
    summary["labels"] = dict(Counter(r.label for r in results if r.ok))
    summary["failures"] = dict(Counter(r.status for r in results if not r.ok))
    if unfinished:
        summary["not_scored_interrupted"] = unfinished
    return summary


def _settings_from(args: argparse.Namespace) -> Settings:
    overrides = {
        name: getattr(args, name)
        for name in (
            "method",
            "strictness",
            "noncommittal",
            "generation",
            "concurrency",
            "llm",
            "llm_model",
            "llm_base_url",
            "embeddings",
            "embedding_model",
            "embedding_base_url",
        )
        if getattr(args, name, None) is not None
    }
    return Settings.resolve(**overrides)


async def _score_rows(engine: Engine, rows: list[InputRow], mapping: ColumnMapping, concurrency: int, on_done: Any) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(index: int, row: InputRow) -> None:
        if row.error is not None:
            result = RelevancyResult.failure(Status.INVALID_INPUT, row.error, method=engine.settings.method)
        else:
            async with limit:
                try:
                    question, answer, contexts = mapping.extract(row.data)
                except Exception as exc:
                    result = RelevancyResult.failure(Status.INVALID_INPUT, f"line {row.line}: missing column {exc}", method=engine.settings.method)
                else:
                    result = await engine.ascore(question, answer, contexts)
        on_done(index, result)

    await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))


def cmd_score(args: argparse.Namespace) -> int:
    settings = _settings_from(args)
    engine = Engine(settings)
    mapping = ColumnMapping(question=args.question_column, answer=args.answer_column, contexts=args.contexts_column)
    rows = list(read_rows(args.input, args.format))
    if args.limit is not None:
        rows = rows[: args.limit]
    writer = RowWriter(args.output, args.output_format) if args.output else None
    results: dict[int, RelevancyResult] = {}
    next_to_write = 0

    def emit(index: int) -> None:
        row = output_row(rows[index].data, results[index], rows[index].line)
        if writer is not None:
            writer.write(row)
        else:
            sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            sys.stdout.flush()

    from tqdm import tqdm

    bar = tqdm(total=len(rows), unit="row", disable=args.no_progress, file=sys.stderr, dynamic_ncols=True)

    lock = threading.Lock()
    closed = False

    def on_done(index: int, result: RelevancyResult) -> None:
        nonlocal next_to_write
        with lock:
            if closed:  # after Ctrl-C the output is final
                return
            results[index] = result
            bar.update(1)
            if result.ok:
                bar.set_postfix_str(f"last={result.score:.3f} {result.label}")
            while next_to_write in results:  # keep input order
                emit(next_to_write)
                next_to_write += 1

    finished = threading.Event()

    async def run_all() -> None:
        try:
            await _score_rows(engine, rows, mapping, settings.concurrency, on_done)
        finally:
            finished.set()

    interrupted = False
    future = asyncio.run_coroutine_threadsafe(run_all(), _sync_loop.loop())
    try:
        future.result()
    except KeyboardInterrupt:
        interrupted = True
        future.cancel()  # cancels every in-flight evaluation; local generation stops within a token
        finished.wait(30)
    finally:
        with lock:
            closed = True
            bar.close()
            for index in sorted(i for i in results if i >= next_to_write):  # finished rows after a gap
                emit(index)
            if writer is not None:
                writer.close()
    ordered = [results[i] for i in sorted(results)]
    summary = summarise(ordered, unfinished=len(rows) - len(results))
    print(("interrupted: " if interrupted else "") + "summary " + json.dumps(summary, ensure_ascii=False), file=sys.stderr)
    return 130 if interrupted else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relevancy-tracer", description="Answer-relevancy scoring and tracing for RAG apps.")
    sub = parser.add_subparsers(dest="command", required=True)

    score = sub.add_parser("score", help="score a JSONL, CSV or Parquet dataset")
    score.add_argument("input", help="input file (.jsonl, .csv, .parquet)")
    score.add_argument("-o", "--output", help="output file (.jsonl, .csv, .parquet); default: JSONL on stdout")
    score.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: from the file name)")
    score.add_argument("--output-format", choices=("jsonl", "csv", "parquet"), help="output format (default: from the file name)")
    score.add_argument("--question-column", help="column or dotted path of the question (default: question | user_input | query)")
    score.add_argument("--answer-column", help="column or dotted path of the answer (default: answer | response)")
    score.add_argument("--contexts-column", help="column or dotted path of the contexts (default: contexts | retrieved_contexts)")
    score.add_argument("--method", choices=METHODS)
    score.add_argument("--strictness", type=int, help="questions generated per answer (N)")
    score.add_argument("--noncommittal", choices=NONCOMMITTAL_RULES)
    score.add_argument("--generation", choices=GENERATION_MODES)
    score.add_argument("--concurrency", type=int, help="rows scored at once")
    score.add_argument("--llm", choices=("local", "openai"))
    score.add_argument("--llm-model")
    score.add_argument("--llm-base-url")
    score.add_argument("--embeddings", choices=("local", "openai"))
    score.add_argument("--embedding-model")
    score.add_argument("--embedding-base-url")
    score.add_argument("--limit", type=int, help="score only the first N rows")
    score.add_argument("--no-progress", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score)

    demo = sub.add_parser("demo", help="run the example RAG app with tracing into a local Phoenix")
    demo.add_argument("--questions", type=int, default=None, help="how many example questions to ask (default: all)")
    demo.add_argument("--phoenix-port", type=int, default=None, help="Phoenix port (default: PHOENIX_PORT or 4318)")
    demo.add_argument("--no-phoenix", action="store_true", help="do not start Phoenix; export to OTEL_EXPORTER_OTLP_ENDPOINT")
    demo.add_argument("--keep-running", action="store_true", help="keep Phoenix running after the demo until Ctrl-C")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``relevancy-tracer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, ImportError, OSError) as exc:  # bad arguments, missing files
        print(f"relevancy-tracer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
