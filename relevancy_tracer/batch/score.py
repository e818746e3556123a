"""``relevancy-tracer score``: score every row of a file, written in input order.

:func:`score_file` reads JSONL, CSV or Parquet (a file, a FIFO or pipe, or ``-`` for standard
input; read once, as it is scored), scores every row concurrently, and writes one output row
per input row, in input order: the input fields plus :data:`OUTPUT_FIELDS`. A progress bar and
a summary (count, mean, quantiles, label counts, failures by status) go to stderr; for a
regular JSONL or CSV file the bar counts the bytes of the scored rows up to the file's size
(exact, and the file is read once), for Parquet its rows up to the footer's count; a stream,
or a run with ``--limit``, counts rows (up to the limit; a stream has no total). Bad rows
never stop the run. The output goes to a temporary file renamed over the output path at the
end; the output may not be the input. SIGINT or SIGTERM writes every row finished so far and
exits with status 130 or 143; a write error stops the run, prints the finished rows the output
refused on stdout and exits with 1.

Memory does not grow with the input: rows are read at most :func:`window_for` rows ahead of
the output (a slow row holds back the reading, not the memory), a JSONL output is written as
rows finish, and the summary keeps one float per scored row. CSV and Parquet outputs (whose
columns are the union over all rows) are written at the end: until then finished rows wait on
disk, in an unlinked file beside the output (:class:`~relevancy_tracer.dataset.RowWriter`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from array import array
from collections import Counter
from concurrent.futures import CancelledError, TimeoutError as FutureTimeout
from typing import Any, Optional

from ..config import Settings
from ..dataset.columns import ColumnMapping
from ..dataset.reading import STDIN, InputRow, file_extent
from ..dataset.writing import RowWriter
from ..result import RelevancyResult
from .._background.loop import process_loop
from .._signals import StopSignals
from ..scoring.engine import Engine
from .rows import SIGNAL_LATENCY, RowStream, refuse_same_file, score_stream

#: Rows read ahead of the output per evaluation slot, and at least (see :func:`window_for`).
ROWS_PER_SLOT = 8
MIN_WINDOW = 64


def window_for(concurrency: int) -> int:
    """Most rows read and not yet written, for ``concurrency`` evaluations at once:
    ``max(MIN_WINDOW, ROWS_PER_SLOT * concurrency)``. Enough to keep every slot busy while a slow
    row holds back the in-order output; the rows' memory is bounded by it."""
    return max(MIN_WINDOW, ROWS_PER_SLOT * max(1, int(concurrency)))


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
    "standalone_question",
    "history_turns",
    "history_status",
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


class Summary:
    """Count, mean, quantiles (p10-p90), label and failure-kind counts of scored results, and
    failures by status, accumulated one result at a time (one float kept per scored row)."""

    def __init__(self) -> None:
        self.rows = 0
        self.scores = array("d")
        self.labels: Counter = Counter()
        self.failure_kinds: Counter = Counter()
        self.failures: Counter = Counter()

    def add(self, result: RelevancyResult) -> None:
        self.rows += 1
        if result.ok:
            self.scores.append(float(result.score))  # type: ignore[arg-type]
            self.labels[result.label] += 1
            if result.failure_kind:
                self.failure_kinds[result.failure_kind] += 1
        else:
            self.failures[result.status] += 1

    def as_dict(self, unfinished: int = 0) -> dict:
        """The summary; ``unfinished`` rows (read, not finished: interrupted) are counted apart."""
        import numpy as np

        scores = np.frombuffer(self.scores, dtype=float) if len(self.scores) else np.zeros(0)
        summary: dict[str, Any] = {"rows": self.rows + unfinished, "scored": int(scores.size)}
        if scores.size:
            summary["mean"] = round(float(scores.mean()), 4)
            for q in (10, 25, 50, 75, 90):
                summary[f"p{q}"] = round(float(np.percentile(scores, q)), 4)
        summary["labels"] = dict(self.labels)
        summary["failure_kinds"] = dict(self.failure_kinds)
        summary["failures"] = dict(self.failures)
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
    docstring. Returns the exit status: 0, 1 (a write error, or the input failed after some
    rows were read), or 128 + the signal that stopped it. Raises ValueError when ``output`` is
    the input, OSError when the output cannot be created, and what
    :func:`~relevancy_tracer.dataset.read_rows` raises for an input that cannot be opened or
    read (before any row is scored)."""
    engine = Engine(settings)
    refuse_same_file(input_path, output)
    writer = RowWriter(output, output_format) if output else None
    stream = RowStream(input_path, input_format, limit, window_for(engine.settings.concurrency))
    with StopSignals() as signals:
        return _score_stream_into(engine, mapping, stream, writer, progress, signals)


def _progress_bar(stream: RowStream, progress: bool) -> tuple[Any, bool]:
    """The progress bar (tqdm, on stderr) of ``stream`` and whether it counts bytes: the bytes
    of a regular JSONL or CSV file (each row adds its ``consumed`` bytes), else rows, up to a
    Parquet file's row count, or ``--limit``, or no total (a stream)."""
    from tqdm import tqdm

    extent = file_extent(stream.input_path, stream.input_format) if progress else None
    if extent is not None and extent[0] == "bytes" and stream.limit is None:
        bar = tqdm(total=extent[1], unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, dynamic_ncols=True)
        return bar, True
    total = stream.limit
    if extent is not None and extent[0] == "rows":
        total = extent[1] if total is None else min(total, extent[1])
    return tqdm(total=total, unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True), False


def _finish_bar(bar: Any, in_bytes: bool, stream: RowStream, stopped: bool) -> None:
    """At the end of a run that read its whole input (not ``stopped``, no read error), the bar
    shows its end: the blank lines after the last row in bytes, or the rows read when a limit
    (its total) was more than the input held."""
    if stopped or stream.error is not None or bar.total is None or bar.n >= bar.total:
        return
    if in_bytes:
        bar.update(bar.total - bar.n)
    elif stream.limit is None or stream.read < stream.limit:
        bar.total = bar.n
        bar.refresh()


def _score_stream_into(engine: Engine, mapping: ColumnMapping, stream: RowStream, writer: Optional[RowWriter], progress: bool, signals: StopSignals) -> int:
    """Score the rows of ``stream`` into ``writer`` (None: stdout), in input order. A signal or
    a write error stops scoring; every finished row is still written (rows the output refused
    go to stdout as JSONL)."""
    name = "standard input" if stream.input_path == STDIN else stream.input_path
    if hasattr(sys.stdout, "reconfigure"):  # lone surrogates from the input must not fail a row
        sys.stdout.reconfigure(errors="backslashreplace")
    finished: dict[int, tuple[InputRow, RelevancyResult]] = {}  # done, waiting for an earlier row
    next_to_write = 0
    unwritten: list[dict] = []  # finished rows the output refused (at most the window)
    write_error: Optional[BaseException] = None
    summary = Summary()
    running: list[Any] = []  # the scoring future, cancelled by a write error or a signal

    stdout_error: list[BaseException] = []  # the first failed write to stdout: scoring stops

    def print_row(row: dict) -> None:
        """Write one row to stdout; never raises. A closed pipe (``| head``), a full disk
        (``/dev/full``): the error is kept, scoring is cancelled and no more is written."""
        if stdout_error:
            return
        try:
            sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError, ENOSPC; ValueError: stdout closed
            stdout_error.append(exc)
            if running:
                running[0].cancel()

    def emit(row: InputRow, result: RelevancyResult) -> None:
        nonlocal write_error
        out = output_row(row.data, result, row.line)
        summary.add(result)
        stream.release(row)
        if writer is None:
            print_row(out)
        elif write_error is not None:
            unwritten.append(out)
        else:
            try:
                writer.write(out)
            except Exception as exc:  # disk full, file too large: stop scoring, keep the rows
                write_error = exc
                unwritten.append(out)
                if running:
                    running[0].cancel()

    bar, in_bytes = _progress_bar(stream, progress)
    lock = threading.Lock()
    closed = False

    def on_done(index: int, row: InputRow, result: RelevancyResult) -> None:
        nonlocal next_to_write
        with lock:
            if closed:  # after Ctrl-C the output is final
                return
            finished[index] = (row, result)
            bar.update(row.consumed if in_bytes else 1)
            shown = [f"last={result.score:.3f} {result.label}"] if result.ok else []
            if in_bytes:  # the rows finished, which a bar of bytes does not count
                rows = summary.rows + len(finished)
                shown.insert(0, f"{rows} row" if rows == 1 else f"{rows} rows")
            if shown:
                bar.set_postfix_str(", ".join(shown))
            while next_to_write in finished:  # keep input order
                emit(*finished.pop(next_to_write))
                next_to_write += 1

    done = threading.Event()

    async def run_all() -> None:
        try:
            await score_stream(engine, stream, mapping, engine.settings.concurrency, on_done)
        finally:
            done.set()

    future = asyncio.run_coroutine_threadsafe(run_all(), process_loop().loop())
    running.append(future)

    def stop() -> None:
        stream.stop()
        future.cancel()  # stops every in-flight evaluation; local generation within a token

    signals.on_stop(stop)
    try:
        while True:  # in slices, so a signal is handled whichever thread received it
            try:
                future.result(SIGNAL_LATENCY)
                break
            except FutureTimeout:
                if signals.signum is not None and not future.cancelled():
                    stop()
    except CancelledError:
        done.wait(30)
    finally:
        with lock:
            closed = True
            stopped = signals.signum is not None or write_error is not None or future.cancelled()
            _finish_bar(bar, in_bytes, stream, stopped)
            bar.close()
            for index in sorted(finished):  # finished rows after a gap
                emit(*finished.pop(index))
        unfinished = stream.read - summary.rows
        refused = 0  # finished rows printed to stdout instead of the output file
        if writer is not None:
            try:
                if stream.read == 0 and (signals.signum is not None or stream.error is not None):
                    writer.discard()  # interrupted or failed before a row came: nothing to write
                else:
                    writer.close()
            except Exception as exc:
                write_error = write_error or exc
                for row in writer.pending_rows():  # held for a CSV/Parquet output: given back
                    print_row(row)
                    refused += 1
            for row in unwritten:
                print_row(row)
                refused += 1
    if signals.signum is not None and stream.read == 0:
        print(f"relevancy-tracer: interrupted while reading {name}: nothing scored, nothing written", file=sys.stderr)
        return signals.exit_status
    if stream.error is not None and stream.read == 0 and write_error is None:
        raise stream.error  # the input could not be opened or read: nothing was scored
    if writer is not None and writer.stringified:
        print(f"relevancy-tracer: warning: column(s) {', '.join(map(repr, writer.stringified))} mix types; written to {writer.path} as strings", file=sys.stderr)
    if stdout_error:
        return _stdout_failed(stdout_error[0], summary.rows, summary.as_dict(unfinished=unfinished))
    status = "stopped: " if write_error is not None else "interrupted: " if signals.signum is not None else ""
    print(status + "summary " + json.dumps(summary.as_dict(unfinished=unfinished), ensure_ascii=False), file=sys.stderr)
    if write_error is not None:
        kept = f"it holds the first {writer.written} row(s)" if writer is not None and writer.written else "it was left as it was"
        print(f"relevancy-tracer: error: cannot write {writer.path if writer else 'stdout'} ({write_error}); {kept}; the other {refused} finished row(s) went to stdout as JSONL", file=sys.stderr)
        return 1
    if stream.error is not None:
        print(f"relevancy-tracer: error: reading {name} failed after {stream.read} row(s) ({type(stream.error).__name__}: {stream.error}); the rows before it are scored and written", file=sys.stderr)
        return 1
    return signals.exit_status if signals.signum is not None else 0


def _stdout_failed(error: BaseException, rows: int, summary: dict) -> int:
    """Report a failed write to stdout and return the exit status 1. stdout is pointed at
    ``os.devnull`` first (Python's advice for ``BrokenPipeError``, docs of the ``signal``
    module), so the interpreter's last flush at exit raises nothing more."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind sys.stdout
        pass
    reason = "the reader closed it" if isinstance(error, BrokenPipeError) else f"{type(error).__name__}: {error}"
    try:
        print(f"stopped: summary {json.dumps(summary, ensure_ascii=False)}", file=sys.stderr)
        print(f"relevancy-tracer: error: cannot write stdout ({reason}); stopped after {rows} row(s)", file=sys.stderr)
    except (OSError, ValueError):  # stderr is gone too
        pass
    return 1
