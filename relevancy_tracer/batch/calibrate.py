"""``relevancy-tracer calibrate``: fit a calibration (raw score -> probability that the answer
addresses the question) on labelled rows.

:func:`calibrate_file` reads the rows, takes each one's 0/1 label, scores the labelled rows raw
(or reads raw scores from a column), fits Platt scaling or isotonic regression
(:func:`~relevancy_tracer.scoring.calibration.fit_evaluator_calibration`), prints the AUROC,
the cross-validated expected calibration error, the label's balanced accuracy and the
reliability table, and writes the calibration JSON atomically.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from concurrent.futures import CancelledError
from typing import Any, Optional

from ..config import Settings
from ..dataset.columns import ColumnMapping, resolve_path
from ..dataset.reading import InputRow, read_rows
from ..dataset.writing import write_atomically
from ..result import RelevancyResult
from .._background.loop import process_loop
from .._signals import StopSignals
from ..scoring.engine import Engine
from .rows import refuse_same_file, score_rows


def label_of(value: Any) -> Optional[int]:
    """A 0/1 label from a cell: bools, 0/1 numbers, or the strings 0/1/true/false/yes/no
    (any case, surrounding blanks ignored); None for anything else."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false", "yes", "no"):
        return int(value.strip().lower() in ("1", "true", "yes"))
    return None


def calibrate_file(
    input_path: str,
    output: str,
    settings: Settings,
    mapping: ColumnMapping,
    *,
    label_column: str = "label",
    raw_column: Optional[str] = None,
    kind: str = "platt",
    prior: Optional[float] = None,
    folds: int = 5,
    input_format: Optional[str] = None,
    limit: Optional[int] = None,
    progress: bool = True,
) -> int:
    """Fit a calibration on the labelled rows of ``input_path`` and write it to ``output``.

    Args:
        settings: the evaluator to calibrate (its own calibration is ignored: raw scores).
        mapping: the question, answer and contexts columns.
        label_column: column or dotted path of the 0/1 label (1: the answer addresses the
            question); rows without one are skipped and counted.
        raw_column: read raw scores from this column instead of scoring the rows.
        kind: ``platt`` (class-balanced: the map is the evidence, the prior stated apart) or
            ``isotonic``.
        prior: the share of relevant answers in the traffic, in (0, 1) (default: these rows').
        folds: folds of the cross-validated calibration error (at most the smaller class).
        input_format, limit, progress: as for ``score``.

    Returns:
        The exit status: 0 written; 2 fewer than 10 scored rows or a single label; 128 + the
        signal that stopped the scoring (nothing written, ``output`` left as it was).

    Raises:
        ValueError: ``output`` is the input. What :func:`~relevancy_tracer.dataset.read_rows`
        raises for an unreadable input.
    """
    import numpy as np

    from ..scoring.calibration import balanced_accuracy, expected_calibration_error, fit_evaluator_calibration, reliability_table
    from ..scoring.evaluator import thresholds_for

    settings = settings.replace(calibration="none")
    engine = Engine(settings)
    refuse_same_file(input_path, output)
    rows, unread = [], 0
    for row in read_rows(input_path, input_format):
        if row.error is None:
            rows.append(row)
            continue
        unread += 1  # the line is reported and the run goes on, as in `score`
        if unread <= 10:
            print(f"calibrate: skipped {row.error}", file=sys.stderr)
    if unread > 10:
        print(f"calibrate: skipped {unread - 10} more unreadable line(s)", file=sys.stderr)
    if limit is not None:
        rows = rows[:limit]
    labelled: list[tuple[InputRow, int]] = []
    unlabelled = 0
    for row in rows:
        try:
            label = label_of(resolve_path(row.data, label_column))
        except KeyError:
            label = None
        if label is None:
            unlabelled += 1
        else:
            labelled.append((row, label))
    if unlabelled:
        print(f"calibrate: {unlabelled} row(s) without a 0/1 {label_column!r} skipped", file=sys.stderr)
    raws: dict[int, float] = {}
    failures: Counter = Counter()
    if raw_column:
        for index, (row, _) in enumerate(labelled):
            try:
                value = float(resolve_path(row.data, raw_column))
            except (KeyError, TypeError, ValueError):
                failures["no_raw_score"] += 1
                continue
            if np.isfinite(value):
                raws[index] = value
    else:
        from tqdm import tqdm

        bar = tqdm(total=len(labelled), unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True)
        lock = threading.Lock()

        def on_done(index: int, result: RelevancyResult) -> None:
            with lock:
                bar.update(1)
                if result.ok and result.raw_score is not None:
                    raws[index] = result.raw_score
                else:
                    failures[result.status] += 1

        with StopSignals() as signals:
            future = process_loop().submit(lambda: score_rows(engine, [row for row, _ in labelled], mapping, settings.concurrency, on_done))
            signals.on_stop(future.cancel)
            try:
                future.result()
            except CancelledError:
                pass
            finally:
                bar.close()
        if signals.signum is not None:
            print(f"calibrate: interrupted after {len(raws)} of {len(labelled)} rows; no calibration written ({output} is as it was)", file=sys.stderr)
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
    folds = max(2, min(folds, int(min(labels.sum(), len(labels) - labels.sum()))))
    models = engine._models_for(settings)
    calibration, cv = fit_evaluator_calibration(
        raw,
        labels,
        kind,
        method=settings.method,
        models=(models.llm.name, models.embedder.name if models.embedder else ""),
        raw_fingerprint=engine.raw_fingerprint(settings, models),
        source=os.path.basename(input_path),
        folds=folds,
        groups=questions,
        balanced=kind == "platt",
        prior=prior,
        label_column=label_column,
        raw_scores=f"column {raw_column}" if raw_column else "scored by this command",
    )
    fitted = calibration.apply(raw, float(labels.mean()))
    thresholds = thresholds_for(settings, True)
    decision = (calibration.evidence(raw) if settings.thresholds is None else fitted) >= thresholds[0]
    table = reliability_table(cv, labels)
    print(f"calibration ({kind}) on {len(raw)} rows ({int(labels.sum())} relevant), method {settings.method}, models {calibration.models[0]} + {calibration.models[1]}")
    print(f"AUROC of the raw score: {calibration.metrics['auroc']:.3f}")
    print(f"expected calibration error: {calibration.metrics['ece_cross_validated']:.3f} ({folds}-fold cross-validated), {expected_calibration_error(fitted, labels):.3f} in sample")
    on = f"log likelihood ratio >= {thresholds[0]}" if settings.thresholds is None else f"probability >= {thresholds[0]}"
    print(f"label 'directly_addresses' ({on}): balanced accuracy {balanced_accuracy(decision, labels):.3f} in sample")
    if calibration.prior is not None:
        print(f"prior: {calibration.prior:.3f} (the share of relevant answers the scores assume{': these rows' if prior is None else ''}; override with relevancy_prior)")
    print("\nreliability (cross-validated probabilities):")
    print(f"{'bin':>11}  {'rows':>5}  {'mean probability':>16}  {'observed relevant':>17}")
    for row in table:
        print(f"{row['low']:.1f} - {row['high']:.1f}  {row['count']:>5}  {row['mean_probability']:>16.3f}  {row['observed']:>17.3f}")
    write_atomically(output, calibration.to_json() + "\n")
    print(f"\nwritten: {output} (use it with calibration={output} or RELEVANCY_TRACER_CALIBRATION={output})")
    return 0
