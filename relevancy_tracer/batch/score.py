"""``relevancy-tracer score``: score every row of a file, written in input order.

:func:`score_file` reads JSONL, CSV or Parquet (a file, a FIFO or pipe, or ``-`` for standard
input; read once), scores every row concurrently, and writes one output row per input row, in
input order: the input fields plus :data:`OUTPUT_FIELDS`. A progress bar and a summary (count,
mean, quantiles, label counts, failures by status) go to stderr. Bad rows never stop the run.
The output goes to a temporary file renamed over the output path at the end; the output may not
be the input. SIGINT or SIGTERM writes every row finished so far and exits with status 130 or
143; a write error stops the run, prints the finished rows the output refused on stdout and
exits with 1.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections import Counter
from concurrent.futures import CancelledError
from typing import Any, Optional, Sequence

from ..config import Settings
from ..dataset import ColumnMapping, InputRow, RowWriter
from ..result import RelevancyResult
from .._background.loop import process_loop
from .._signals import StopSignals
from ..scoring.engine import Engine
from .rows import read_input, refuse_same_file, score_rows

#: The result fields of an output row, in order, after the input's own fields.
OUTPUT_FIELDS = (
    "score",
    "raw_score",
    "calibrated",
    "evaluator_version",
    "label",
    "explanation",
    "failure_kind",
    "evidence",
    "prior",
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
    """The output record of one input row: input fields (or ``line`` for an unreadable row),
    then the result's :data:`OUTPUT_FIELDS` (latency rounded to 0.1 ms)."""
    row = dict(data) if data else {"line": line}
    values = result.to_dict()
    for name in OUTPUT_FIELDS:
        row[name] = values.get(name)
    row["latency_ms"] = round(row["latency_ms"] or 0.0, 1)
    return row


def summarise(results: Sequence[RelevancyResult], unfinished: int = 0) -> dict:
    """Count, mean, quantiles (p10-p90), label and failure-kind counts of the scored
    ``results``, and failures by status; ``unfinished`` rows (interrupted) are counted apart."""
    import numpy as np

    scores = np.asarray([r.score for r in results if r.ok], dtype=float)
    summary: dict[str, Any] = {"rows": len(results) + unfinished, "scored": int(scores.size)}
    if scores.size:
        summary["mean"] = round(float(scores.mean()), 4)
        for q in (10, 25, 50, 75, 90):
            summary[f"p{q}"] = round(float(np.percentile(scores, q)), 4)
    summary["labels"] = dict(Counter(r.label for r in results if r.ok))
    summary["failure_kinds"] = dict(Counter(r.failure_kind for r in results if r.ok and r.failure_kind))
    summary["failures"] = dict(Counter(r.status for r in results if not r.ok))
    if unfinished:
        summary["not_scored_interrupted"] = unfinished
    return summary


def score_file(
    input_path: str,
    output: Optional[str],
    settings: Settings,
    mapping: ColumnMapping,
    *,
    input_format: Optional[str] = None,
    output_format: Optional[str] = None,
    limit: Optional[int] = None,
    progress: bool = True,
) -> int:
    """Score the rows of ``input_path`` into ``output`` (None: JSONL on stdout); see the module
    docstring. Returns the exit status: 0, 1 (a write error), or 128 + the signal that stopped
    it. Raises ValueError when ``output`` is the input, and what
    :func:`~relevancy_tracer.dataset.read_rows` raises for an unreadable input."""
    engine = Engine(settings)
    refuse_same_file(input_path, output)
    with StopSignals() as signals:
        rows = read_input(input_path, input_format, limit, signals)
        if rows is None:  # stopped while reading: nothing scored, nothing written
            return signals.exit_status
        return _score_rows_into(engine, mapping, rows, output, output_format, progress, signals)


def _score_rows_into(engine: Engine, mapping: ColumnMapping, rows: list[InputRow], output: Optional[str], output_format: Optional[str], progress: bool, signals: StopSignals) -> int:
    """Score ``rows`` into ``output`` (or stdout), in input order. A signal or a write error
    stops scoring; every finished row is still written (rows the output refused go to stdout
    as JSONL)."""
    if hasattr(sys.stdout, "reconfigure"):  # lone surrogates from the input must not fail a row
        sys.stdout.reconfigure(errors="backslashreplace")
    writer = RowWriter(output, output_format) if output else None
    results: dict[int, RelevancyResult] = {}
    next_to_write = 0
    unwritten: list[dict] = []  # finished rows the output refused
    write_error: Optional[BaseException] = None
    running: list[Any] = []  # the scoring future, cancelled by a write error

    def print_row(row: dict) -> None:
        sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()

    def emit(index: int) -> None:
        nonlocal write_error
        row = output_row(rows[index].data, results[index], rows[index].line)
        if writer is None:
            print_row(row)
        elif write_error is not None:
            unwritten.append(row)
        else:
            try:
                writer.write(row)
            except Exception as exc:  # disk full, file too large: stop scoring, keep the rows
                write_error = exc
                unwritten.append(row)
                if running:
                    running[0].cancel()

    from tqdm import tqdm

    bar = tqdm(total=len(rows), unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True)

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
            await score_rows(engine, rows, mapping, engine.settings.concurrency, on_done)
        finally:
            finished.set()

    future = asyncio.run_coroutine_threadsafe(run_all(), process_loop().loop())
    running.append(future)
    # cancelling stops every in-flight evaluation; local generation stops within a token
    signals.on_stop(future.cancel)
    if write_error is not None:
        future.cancel()
    try:
        future.result()
    except CancelledError:
        finished.wait(30)
    finally:
        with lock:
            closed = True
            bar.close()
            for index in sorted(i for i in results if i >= next_to_write):  # finished rows after a gap
                emit(index)
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:
                write_error = write_error or exc
                unwritten[:0] = writer.pending
            for row in unwritten:
                print_row(row)
    ordered = [results[i] for i in sorted(results)]
    summary = summarise(ordered, unfinished=len(rows) - len(results))
    if writer is not None and writer.stringified:
        print(f"relevancy-tracer: warning: column(s) {', '.join(map(repr, writer.stringified))} mix types; written to {output} as strings", file=sys.stderr)
    status = "stopped: " if write_error is not None else "interrupted: " if signals.signum is not None else ""
    print(status + "summary " + json.dumps(summary, ensure_ascii=False), file=sys.stderr)
    if write_error is not None:
        kept = f"it holds the first {writer.written} row(s)" if writer is not None and writer.written else "it was left as it was"
        print(f"relevancy-tracer: error: cannot write {output} ({write_error}); {kept}; the other {len(unwritten)} finished row(s) went to stdout as JSONL", file=sys.stderr)
        return 1
    return signals.exit_status if signals.signum is not None else 0
