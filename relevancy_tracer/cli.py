"""Command line: ``relevancy-tracer score`` (batch scoring), ``relevancy-tracer calibrate``
(fit a calibration on labelled rows) and ``relevancy-tracer demo``.

``score INPUT [-o OUTPUT]`` reads JSONL, CSV or Parquet (a file, a FIFO or pipe, or ``-`` for
standard input; read once), scores every row concurrently, and
writes one output row per input row, in input order: the input fields plus score, label,
explanation, method, components, generated_questions, similarities, noncommittal,
sub_questions, intent, status, error and usage. A progress bar and a summary (count, mean,
quantiles, label counts, failures by status) go to stderr. Bad rows never stop the run. The
output goes to a temporary file renamed over OUTPUT at the end; OUTPUT may not be INPUT. Ctrl-C
(SIGINT) or SIGTERM writes every row finished so far and exits with status 130 or 143; a write
error stops the run, prints the finished rows the output refused on stdout and exits with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import sys
import threading
from collections import Counter
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .config import GENERATION_MODES, NONCOMMITTAL_RULES, Settings, settings_table, with_settings_table
from .dataset import STDIN, ColumnMapping, InputRow, RowWriter, read_rows, same_file, write_atomically
from .result import RelevancyResult, Status
from ._logging import mask_credentials, mask_credentials_in
from ._background.loop import process_loop
from .scoring.engine import Engine
from .scoring.methods import METHODS

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
    summary["failure_kinds"] = dict(Counter(r.failure_kind for r in results if r.ok and r.failure_kind))
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
            "calibration",
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


class _StopSignals:
    """While active (in the main thread), SIGINT and SIGTERM call ``stop`` instead of raising
    KeyboardInterrupt or killing the process, so the command ends the way it chooses and
    keeps what it finished. A SIGINT the parent ignores (a background job) stays ignored.
    ``signum`` is the first signal received (None: none); ``exit_status`` is 128 + signum."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._stop: Optional[Callable[[], None]] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        import signal

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._received)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back; default then
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _received(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self._stop is not None:
            self._stop()

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` on the next signal (now, if one already came)."""
        self._stop = stop
        if self.signum is not None:
            stop()

    @property
    def exit_status(self) -> int:
        return 128 + (self.signum or 0)


def _refuse_same_file(input_path: str, output: Optional[str]) -> None:
    """ValueError when ``output`` is the input file (same path, symlink or hard link; for ``-``,
    the file standard input was redirected from)."""
    source = "/dev/stdin" if input_path == STDIN else input_path
    if output and same_file(source, output):
        raise ValueError(f"-o {output} is the input file {input_path}; write the output to another file")


#: Longest a signal waits for the main thread while the input is read: the read runs on a
#: thread of its own, and the main thread waits for it in slices of this many seconds.
SIGNAL_LATENCY = 0.25


def _read_input(args: argparse.Namespace, signals: "_StopSignals") -> Optional[list[InputRow]]:
    """The rows of ``args.input`` (at most ``args.limit``), or None when SIGINT or SIGTERM came
    while reading; raises what :func:`read_rows` raises.

    The input is read on a daemon thread while the main thread waits for it in slices of
    :data:`SIGNAL_LATENCY` seconds: a read (or the open of a FIFO) blocked on a silent writer
    cannot hold off a signal, whichever thread of the process the kernel delivered it to (a
    signal interrupts a blocked system call only in the thread that received it, and the
    native threads of numpy's BLAS can be that thread)."""
    rows: list[InputRow] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            for row in read_rows(args.input, args.format):
                if done.is_set() or (args.limit is not None and len(rows) >= args.limit):
                    return
                rows.append(row)
        except BaseException as exc:  # handed to the main thread
            failures.append(exc)
        finally:
            done.set()

    signals.on_stop(done.set)
    threading.Thread(target=read, name="relevancy-tracer-input", daemon=True).start()
    while not done.wait(SIGNAL_LATENCY):
        pass
    signals.on_stop(lambda: None)
    if signals.signum is not None:
        name = "standard input" if args.input == STDIN else args.input
        print(f"relevancy-tracer: interrupted while reading {name}: nothing scored, nothing written", file=sys.stderr)
        return None
    if failures:
        raise failures[0]
    return rows


def cmd_score(args: argparse.Namespace) -> int:
    settings = _settings_from(args)
    engine = Engine(settings)
    mapping = ColumnMapping(question=args.question_column, answer=args.answer_column, contexts=args.contexts_column)
    _refuse_same_file(args.input, args.output)
    with _StopSignals() as signals:
        rows = _read_input(args, signals)
        if rows is None:  # stopped while reading: nothing scored, nothing written
            return signals.exit_status
        return _score_file(args, engine, mapping, rows, signals)


def _score_file(args: argparse.Namespace, engine: Engine, mapping: ColumnMapping, rows: list[InputRow], signals: _StopSignals) -> int:
    """Score ``rows`` into ``args.output`` (or stdout), in input order. A signal or a write
    error stops scoring; every finished row is still written (rows the output refused go to
    stdout as JSONL)."""
    if hasattr(sys.stdout, "reconfigure"):  # lone surrogates from the input must not fail a row
        sys.stdout.reconfigure(errors="backslashreplace")
    writer = RowWriter(args.output, args.output_format) if args.output else None
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
            await _score_rows(engine, rows, mapping, engine.settings.concurrency, on_done)
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
        print(f"relevancy-tracer: warning: column(s) {', '.join(map(repr, writer.stringified))} mix types; written to {args.output} as strings", file=sys.stderr)
    status = "stopped: " if write_error is not None else "interrupted: " if signals.signum is not None else ""
    print(status + "summary " + json.dumps(summary, ensure_ascii=False), file=sys.stderr)
    if write_error is not None:
        kept = f"it holds the first {writer.written} row(s)" if writer.written else "it was left as it was"
        print(f"relevancy-tracer: error: cannot write {args.output} ({write_error}); {kept}; the other {len(unwritten)} finished row(s) went to stdout as JSONL", file=sys.stderr)
        return 1
    return signals.exit_status if signals.signum is not None else 0


def _label_of(value: Any) -> Optional[int]:
    """A 0/1 label from a cell: bools, 0/1 numbers, or the strings 0/1/true/false/yes/no."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false", "yes", "no"):
        return int(value.strip().lower() in ("1", "true", "yes"))
    return None


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit a calibration on labelled rows: score them (raw), fit, print the reliability table."""
    import numpy as np

    from .dataset import resolve_path
    from .scoring.calibration import balanced_accuracy, expected_calibration_error, fit_evaluator_calibration, reliability_table
    from .scoring.evaluator import thresholds_for

    if args.prior is not None and not 0.0 < args.prior < 1.0:
        print(f"relevancy-tracer: error: --prior must lie strictly between 0 and 1; got {args.prior}", file=sys.stderr)
        return 2
    settings = _settings_from(args).replace(calibration="none")
    engine = Engine(settings)
    mapping = ColumnMapping(question=args.question_column, answer=args.answer_column, contexts=args.contexts_column)
    _refuse_same_file(args.input, args.output)
    rows, unread = [], 0
    for row in read_rows(args.input, args.format):
        if row.error is None:
            rows.append(row)
            continue
        unread += 1  # the line is reported and the run goes on, as in `score`
        if unread <= 10:
            print(f"calibrate: skipped {row.error}", file=sys.stderr)
    if unread > 10:
        print(f"calibrate: skipped {unread - 10} more unreadable line(s)", file=sys.stderr)
    if args.limit is not None:
        rows = rows[: args.limit]
    labelled: list[tuple[InputRow, int]] = []
    unlabelled = 0
    for row in rows:
        try:
            label = _label_of(resolve_path(row.data, args.label_column))
        except KeyError:
            label = None
        if label is None:
            unlabelled += 1
        else:
            labelled.append((row, label))
    if unlabelled:
        print(f"calibrate: {unlabelled} row(s) without a 0/1 {args.label_column!r} skipped", file=sys.stderr)
    raws: dict[int, float] = {}
    failures: Counter = Counter()
    if args.raw_column:
        for index, (row, _) in enumerate(labelled):
            try:
                value = float(resolve_path(row.data, args.raw_column))
            except (KeyError, TypeError, ValueError):
                failures["no_raw_score"] += 1
                continue
            if np.isfinite(value):
                raws[index] = value
    else:
        from tqdm import tqdm

        bar = tqdm(total=len(labelled), unit="row", disable=args.no_progress, file=sys.stderr, dynamic_ncols=True)
        lock = threading.Lock()

        def on_done(index: int, result: RelevancyResult) -> None:
            with lock:
                bar.update(1)
                if result.ok and result.raw_score is not None:
                    raws[index] = result.raw_score
                else:
                    failures[result.status] += 1

        with _StopSignals() as signals:
            future = process_loop().submit(lambda: _score_rows(engine, [row for row, _ in labelled], mapping, settings.concurrency, on_done))
            signals.on_stop(future.cancel)
            try:
                future.result()
            except CancelledError:
                pass
            finally:
                bar.close()
        if signals.signum is not None:
            print(f"calibrate: interrupted after {len(raws)} of {len(labelled)} rows; no calibration written ({args.output} is as it was)", file=sys.stderr)
            return signals.exit_status
    kept = sorted(raws)
    raw = np.asarray([raws[i] for i in kept], dtype=float)
    labels = np.asarray([labelled[i][1] for i in kept], dtype=int)
    if failures:
        print(f"calibrate: {sum(failures.values())} row(s) not scored: {dict(failures)}", file=sys.stderr)
    if len(raw) < 10 or labels.min() == labels.max():
        print("relevancy-tracer: error: calibration needs at least 10 scored rows with both labels (0 and 1)", file=sys.stderr)
        return 2
    questions = [str(mapping.extract(labelled[i][0].data)[0]) for i in kept]
    folds = max(2, min(args.folds, int(min(labels.sum(), len(labels) - labels.sum()))))
    models = engine._models_for(settings)
    calibration, cv = fit_evaluator_calibration(
        raw,
        labels,
        args.kind,
        method=settings.method,
        models=(models.llm.name, models.embedder.name if models.embedder else ""),
        raw_fingerprint=engine.raw_fingerprint(settings, models),
        source=os.path.basename(args.input),
        folds=folds,
        groups=questions,
        balanced=args.kind == "platt",
        prior=args.prior,
        label_column=args.label_column,
        raw_scores=f"column {args.raw_column}" if args.raw_column else "scored by this command",
    )
    fitted = calibration.apply(raw, float(labels.mean()))
    thresholds = thresholds_for(settings, True)
    decision = (calibration.evidence(raw) if settings.thresholds is None else fitted) >= thresholds[0]
    table = reliability_table(cv, labels)
    print(f"calibration ({args.kind}) on {len(raw)} rows ({int(labels.sum())} relevant), method {settings.method}, models {calibration.models[0]} + {calibration.models[1]}")
    print(f"AUROC of the raw score: {calibration.metrics['auroc']:.3f}")
    print(f"expected calibration error: {calibration.metrics['ece_cross_validated']:.3f} ({folds}-fold cross-validated), {expected_calibration_error(fitted, labels):.3f} in sample")
    on = f"log likelihood ratio >= {thresholds[0]}" if settings.thresholds is None else f"probability >= {thresholds[0]}"
    print(f"label 'directly_addresses' ({on}): balanced accuracy {balanced_accuracy(decision, labels):.3f} in sample")
    if calibration.prior is not None:
        print(f"prior: {calibration.prior:.3f} (the share of relevant answers the scores assume{': these rows' if args.prior is None else ''}; override with relevancy_prior)")
    print("\nreliability (cross-validated probabilities):")
    print(f"{'bin':>11}  {'rows':>5}  {'mean probability':>16}  {'observed relevant':>17}")
    for row in table:
        print(f"{row['low']:.1f} - {row['high']:.1f}  {row['count']:>5}  {row['mean_probability']:>16.3f}  {row['observed']:>17.3f}")
    write_atomically(args.output, calibration.to_json() + "\n")
    print(f"\nwritten: {args.output} (use it with calibration={args.output} or RELEVANCY_TRACER_CALIBRATION={args.output})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args)


def _serve_logging() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the HTTP clients log request URLs at INFO
        mask_credentials_in(handler)


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM (Docker, systemd, Kubernetes) and SIGINT stop the command cleanly."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: stop())


def cmd_serve(args: argparse.Namespace) -> int:
    import threading

    from .service.scoring_service import ScoringService

    _serve_logging()
    overrides = {"phoenix_url": args.phoenix_url} if args.phoenix_url else {}
    settings = _settings_from(args)
    if overrides:
        settings = settings.replace(**overrides)
    service = ScoringService(settings, queue_url=args.queue, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port, tls_cert=args.tls_cert, tls_key=args.tls_key, allow_unauthenticated=args.allow_unauthenticated).start()
    scheme = "https" if args.tls_cert else "http"
    print(f"relevancy-tracer serve: OTLP/HTTP {scheme}://{args.host}:{service.server.http_port}/v1/traces and /v1/logs, OTLP/gRPC {args.host}:{service.server.grpc_port}, queue {mask_credentials(args.queue) if args.queue else 'in-process'}", flush=True)
    stopped = threading.Event()
    _stop_on_signals(stopped.set)
    while not stopped.wait(0.5):
        pass
    ok = service.stop(timeout=args.shutdown_timeout)
    skipped = sum(service.skipped.values())
    expired = sum(service.join.expired.values())
    print(f"relevancy-tracer serve: stopped ({service.accepted} spans accepted, {service.refused} requests refused, {skipped} GenAI calls skipped, {expired} unjoined halves expired)", flush=True)
    return 0 if ok else 1


def cmd_worker(args: argparse.Namespace) -> int:
    from .service.fleet_worker import FleetWorker

    _serve_logging()
    settings = _settings_from(args)
    if args.phoenix_url:
        settings = settings.replace(phoenix_url=args.phoenix_url)
    if args.max_deliveries is not None:
        settings = settings.replace(max_deliveries=args.max_deliveries)
    worker = FleetWorker(args.queue, settings, claim_idle=args.claim_idle)
    _stop_on_signals(worker.stop)
    print(f"relevancy-tracer worker {worker.consumer}: consuming {mask_credentials(args.queue)} (max_deliveries {settings.max_deliveries}, dead letters to {worker.queue.dead_letter_stream})", flush=True)
    worker.run(max_jobs=args.max_jobs)
    print(f"relevancy-tracer worker {worker.consumer}: stopped ({worker.scored} scored, {worker.skipped} already done, {worker.reclaimed} reclaimed, {worker.failed} failed, {worker.retried} retried, {worker.dead_lettered} dead-lettered)", flush=True)
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .service.backfill import Backfill

    run = Backfill(args.phoenix, args.project, _settings_from(args), since=args.since, state=Path(args.state) if args.state else None)
    with _StopSignals() as signals:  # SIGINT/SIGTERM: annotate what is finished, keep the cursor
        signals.on_stop(run.stop)
        report = run.run()
    print(json.dumps({"seen": report.seen, "already_annotated": report.already_annotated, "scored": report.scored, "failed": report.failed, **({"interrupted": True} if report.interrupted else {})}))
    if signals.signum is not None:
        return signals.exit_status
    return 0 if report.failed == 0 else 1


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Method and model flags shared by ``score`` and ``calibrate`` (override the settings)."""
    parser.add_argument("--method", choices=tuple(METHODS))
    parser.add_argument("--strictness", type=int, help="questions generated per answer (N)")
    parser.add_argument("--noncommittal", choices=NONCOMMITTAL_RULES)
    parser.add_argument("--generation", choices=GENERATION_MODES)
    parser.add_argument("--concurrency", type=int, help="rows scored at once")
    parser.add_argument("--llm", choices=("local", "openai"))
    parser.add_argument("--llm-model")
    parser.add_argument("--llm-base-url")
    parser.add_argument("--embeddings", choices=("local", "openai"))
    parser.add_argument("--embedding-model")
    parser.add_argument("--embedding-base-url")


def cmd_settings_table(args: argparse.Namespace) -> int:
    """Print the configuration reference table; ``--write FILE`` replaces FILE's table,
    ``--check FILE`` exits 1 when it is out of date."""
    if args.write is None and args.check is None:
        print(settings_table())
        return 0
    path = Path(args.write or args.check)
    text = path.read_text(encoding="utf-8")
    updated = with_settings_table(text)
    if args.check is None:
        path.write_text(updated, encoding="utf-8")
    elif updated != text:
        print(f"{path}: the configuration table is out of date; run: relevancy-tracer settings-table --write {path}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relevancy-tracer", description="Answer-relevancy scoring and tracing for RAG apps.")
    sub = parser.add_subparsers(dest="command", required=True)

    score = sub.add_parser("score", help="score a JSONL, CSV or Parquet dataset")
    score.add_argument("input", help="input file (.jsonl, .csv, .parquet), a FIFO or pipe (with --format), or - for standard input (JSONL unless --format)")
    score.add_argument("-o", "--output", help="output file (.jsonl, .csv, .parquet); default: JSONL on stdout")
    score.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: from the file name)")
    score.add_argument("--output-format", choices=("jsonl", "csv", "parquet"), help="output format (default: from the file name)")
    score.add_argument("--question-column", help="column or dotted path of the question (default: question | user_input | query)")
    score.add_argument("--answer-column", help="column or dotted path of the answer (default: answer | response)")
    score.add_argument("--contexts-column", help="column or dotted path of the contexts (default: contexts | retrieved_contexts)")
    _add_model_flags(score)
    score.add_argument("--calibration", help="auto (default), none, or a calibration JSON file from `relevancy-tracer calibrate`")
    score.add_argument("--limit", type=int, help="score only the first N rows")
    score.add_argument("--no-progress", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score)

    calibrate = sub.add_parser("calibrate", help="fit a calibration (raw score -> probability of relevant) on labelled rows")
    calibrate.add_argument("input", help="labelled rows (.jsonl, .csv, .parquet, or - for standard input) with question, answer and a 0/1 label")
    calibrate.add_argument("-o", "--output", required=True, help="calibration JSON file to write")
    calibrate.add_argument("--label-column", default="label", help="column or dotted path of the 0/1 label (1: the answer addresses the question)")
    calibrate.add_argument("--raw-column", help="use raw scores from this column instead of scoring the rows (e.g. raw_score of a `score` output made with the same settings)")
    calibrate.add_argument("--kind", choices=("platt", "isotonic"), default="platt", help="Platt scaling (default; class-balanced, so the map is the evidence and the prior is stated apart) or isotonic regression")
    calibrate.add_argument("--prior", type=float, default=None, help="the share of relevant answers in the traffic the scores are for, in (0, 1) (default: these rows' share, right when they are a random sample of it)")
    calibrate.add_argument("--folds", type=int, default=5, help="folds of the cross-validated calibration error")
    calibrate.add_argument("--format", choices=("jsonl", "csv", "parquet"), help="input format (default: from the file name)")
    calibrate.add_argument("--question-column", help="column or dotted path of the question")
    calibrate.add_argument("--answer-column", help="column or dotted path of the answer")
    calibrate.add_argument("--contexts-column", help="column or dotted path of the contexts")
    _add_model_flags(calibrate)
    calibrate.add_argument("--limit", type=int, help="use only the first N rows")
    calibrate.add_argument("--no-progress", action="store_true", help="no progress bar")
    calibrate.set_defaults(func=cmd_calibrate)

    demo = sub.add_parser("demo", help="run the example RAG app with tracing into a local Phoenix")
    demo.add_argument("--questions", type=int, default=None, help="how many example questions to ask (default: all)")
    demo.add_argument("--phoenix-port", type=int, default=None, help="Phoenix port (default: PHOENIX_PORT or 4318)")
    demo.add_argument("--no-phoenix", action="store_true", help="do not start Phoenix; export to OTEL_EXPORTER_OTLP_ENDPOINT")
    demo.add_argument("--keep-running", action="store_true", help="keep Phoenix running after the demo until Ctrl-C")
    demo.add_argument("--extractive", action="store_true", help="the app answers with passage sentences instead of generating with the local LLM")
    demo.set_defaults(func=cmd_demo)

    serve = sub.add_parser("serve", help="receive OTLP traces and logs and score the spans of apps that never import this package")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (default 4318; 0: a free port)")
    serve.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (default 4317; 0: a free port)")
    serve.add_argument("--queue", help="redis://HOST:PORT/DB: queue jobs on a Redis Stream for `relevancy-tracer worker` processes (default: score in this process)")
    serve.add_argument("--phoenix-url", help="also write scores as Phoenix span annotations (default: RELEVANCY_TRACER_PHOENIX_URL)")
    serve.add_argument("--shutdown-timeout", type=float, default=20.0, help="seconds to stop on SIGTERM: requests in flight (2 s of it), then queued evaluations and the exporters (default 20: the exit stays inside Kubernetes' 30 s grace period)")
    serve.add_argument("--tls-cert", help="PEM certificate (chain): serve OTLP/HTTP as HTTPS and OTLP/gRPC over TLS (with --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--allow-unauthenticated", action="store_true", help="listen on a non-loopback --host without RELEVANCY_TRACER_SERVICE_TOKEN (only behind a Collector or proxy that authenticates)")
    _add_model_flags(serve)
    serve.set_defaults(func=cmd_serve, calibration=None)

    worker = sub.add_parser("worker", help="consume the Redis Stream that `serve --queue` fills: score, export, acknowledge")
    worker.add_argument("--queue", required=True, help="redis://HOST:PORT/DB")
    worker.add_argument("--phoenix-url", help="also write scores as Phoenix span annotations (default: RELEVANCY_TRACER_PHOENIX_URL)")
    worker.add_argument("--claim-idle", type=float, default=30.0, help="seconds a taken job may go without its worker extending the claim before another worker reclaims it; a job released after a transient failure waits this times 2^(deliveries-1) (default 30)")
    worker.add_argument("--max-deliveries", type=int, default=None, help="deliveries of a job before a failure is final and it moves to the dead-letter stream (default: RELEVANCY_TRACER_MAX_DELIVERIES or 5)")
    worker.add_argument("--max-jobs", type=int, default=None, help=argparse.SUPPRESS)
    _add_model_flags(worker)
    worker.set_defaults(func=cmd_worker, calibration=None)

    fill = sub.add_parser("backfill", help="score spans already stored in Phoenix and annotate them (idempotent, resumable)")
    fill.add_argument("--phoenix", required=True, help="Phoenix base URL")
    fill.add_argument("--project", required=True, help="Phoenix project name")
    fill.add_argument("--since", help="only spans started at or after this ISO 8601 time")
    fill.add_argument("--state", help="file keeping the page cursor, to resume an interrupted run")
    _add_model_flags(fill)
    fill.set_defaults(func=cmd_backfill, calibration=None)

    table = sub.add_parser("settings-table", help="print the configuration reference (Markdown), or write it between a file's <!-- settings-table --> markers")
    target = table.add_mutually_exclusive_group()
    target.add_argument("--write", metavar="FILE", help="replace the table in FILE")
    target.add_argument("--check", metavar="FILE", help="exit 1 when FILE's table is out of date")
    table.set_defaults(func=cmd_settings_table)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``relevancy-tracer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # A native crash (a fault in llama.cpp or another C extension) prints "Fatal Python error:
    # Segmentation fault" and every thread's Python stack, instead of a bare signal exit.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, ImportError, OSError) as exc:  # bad arguments, missing files
        print(f"relevancy-tracer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
