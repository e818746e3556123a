"""Fit the calibration shipped for the embedded default, from the quality benchmark's records.

The calibrated score is meant as the probability that a person judges the answer as addressing
the question. Its labelled data, all from ../shared/data (development sets only):

* ``relevancy_human_en``: human judgements (1 = addresses; 0 = does not, or only partially);
* ``relevancy_pairs_en`` / ``_zh``: each reference answer (1) and its incomplete, evasive,
  off-topic and padded variants (0: by the human set's definition they do not, or only
  partially, address the question);
* ``wikieval_dev``: the answer (1) and the poor answer (0).

Both kinds (Platt, isotonic) are cross-validated (5 folds, rows of one question kept together)
and reported; ``--kind`` (default Platt, as ``relevancy-tracer calibrate``) is fitted on every
row and written with the raw fingerprint of the default evaluator, so ``calibration=auto`` picks
it up exactly when the method, prompts, models and decoding are the ones it was fitted for.
Platt is the default because it is strictly increasing: the calibrated score keeps the raw
ranking (pairwise accuracy and AUROC unchanged), where isotonic regression's flat steps tie
answers the raw score orders.

    python -m benchmarks.fit_calibration --from-parts            # the default, ragas_judge_intent
    python -m benchmarks.fit_calibration --config ragas_judge --recompute-raw

``--recompute-raw`` refits after a change of ragas_judge's combination only: the records'
components are the same model calls' outputs, so their raw scores are recomputed exactly.
``--from-parts`` computes the default's records from the ``ragas_judge`` and ``intent`` runs'
records (:func:`benchmarks.quality.from_parts`: the same requests), real
``ragas_judge_intent`` records replacing them where they exist. The calibration is written for
the method named by ``--config`` with the current code's raw fingerprint.

``--evaluate FILE --held-out human=100,pairs_en=30,pairs_zh=20`` fits nothing: it reports the
expected calibration error (with a bootstrap interval over questions), AUROC and the label's
balanced accuracy of an existing calibration on the records *outside* the first N rows of each
set (the benchmark's fixed hash order), i.e. rows that calibration was not fitted on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent

from relevancy_tracer.config import Settings  # noqa: E402
from relevancy_tracer.scoring.calibration import (  # noqa: E402
    auroc,
    balanced_accuracy,
    cross_validated,
    expected_calibration_error,
    fit_evaluator_calibration,
    reliability_table,
)
from relevancy_tracer.scoring.engine import Engine  # noqa: E402
from relevancy_tracer.scoring.evaluator import DEFAULT_THRESHOLDS, PROBABILITY_THRESHOLDS, evaluator_version  # noqa: E402

SHIPPED = HERE.parent / "relevancy_tracer" / "calibrations"
#: the declared fit subsets: the first N rows of each set in the benchmark's fixed hash order
FIT_ROWS = "human=100,pairs_en=30,pairs_zh=20,wikieval=10"


#: Where the shipped prior comes from (recorded in the calibration file, explained in
#: docs/calibration.md).
PRIOR_SOURCE = (
    "share of production answers people judge relevant: ExpertQA experts rated 382 of 478 system answers "
    "'Useful' (0.80); HaluQuestQA experts flagged no relevance or completeness problem in 469 of 520 judged GPT-4 "
    "answers (0.90); ../shared/data/README_devsets.md"
)


def parse_rows(text: str) -> dict[str, int]:
    """``"human=100,pairs_en=30"`` -> ``{"human": 100, "pairs_en": 30}``."""
    return {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(",") if part.strip())}


def load(records_path: Path, config: str) -> list[dict]:
    from benchmarks.quality import read_records

    latest: dict[tuple, dict] = {}
    for r in read_records(records_path):
        if r.get("config") == config and r.get("raw") is not None and r.get("status") == "scored":
            latest[(r["set"], r["id"], r["cand"])] = r
    return list(latest.values())


def summary(probs: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    if mask.sum() < 10:
        return {}
    return {
        "rows": int(mask.sum()),
        "ece": round(expected_calibration_error(probs[mask], labels[mask]), 3),
        "mean_probability": round(float(probs[mask].mean()), 3),
        "observed": round(float(labels[mask].mean()), 3),
    }


def evaluate_held_out(records: list[dict], calibration_path: Path, fitted_limits: dict[str, int]) -> int:
    """Print ECE [95% CI], AUROC and label balanced accuracy of ``calibration_path`` on the
    records outside the first ``fitted_limits[set]`` rows of each set (hash order)."""
    from benchmarks.quality import _ci, load_items

    from relevancy_tracer.scoring.evaluator import load_calibration

    calibration = load_calibration(str(calibration_path))
    fitted = {(it["set"], it["id"]) for name, limit in fitted_limits.items() for it in load_items([name], limit)}
    held = [r for r in records if (r["set"], r["id"]) not in fitted]
    print(f"{calibration_path.name}: {len(held)} held-out scored rows (fitted on the first {fitted_limits} rows of each set)")
    kinds = {"pooled": lambda r: True, "human": lambda r: r["set"] == "human", "pairs_en": lambda r: r["set"] == "pairs_en", "pairs_zh": lambda r: r["set"] == "pairs_zh"}
    for name, keep in kinds.items():
        rows = [r for r in held if keep(r)]
        if len(rows) < 10:
            continue
        probs = np.asarray([float(calibration(r["raw"])) for r in rows])
        labels = np.asarray([int(r["label"]) for r in rows])
        groups = [f"{r['set']}:{r['id']}" for r in rows]
        ece = expected_calibration_error(probs, labels)
        ci = _ci(lambda idx: expected_calibration_error(probs[idx], labels[idx]), len(rows), groups=groups)
        both = 0 < labels.sum() < len(labels)
        print(
            f"  {name:9s} n={len(rows):4d} positives={int(labels.sum()):4d} ECE {ece:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
            f" mean probability {probs.mean():.3f} observed {labels.mean():.3f}"
            + (f" AUROC {auroc(probs, labels):.3f} label balanced accuracy {balanced_accuracy(probs >= PROBABILITY_THRESHOLDS[0], labels):.3f}" if both else "")
        )
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="ragas_judge_intent", help="config name in the records, which is also the method the calibration is for")
    parser.add_argument("--from-parts", action="store_true", help="ragas_judge_intent / ragas_intent records computed from the ragas_judge and intent records (no model call)")
    parser.add_argument("--records", type=Path, default=HERE / "results" / "quality_records.jsonl.gz", help="quality.py's records (gzip when the name ends in .gz)")
    parser.add_argument("--out", type=Path, default=None, help="default: relevancy_tracer/calibrations/<method>-local.json")
    parser.add_argument("--report", type=Path, default=HERE / "results" / "calibration.json")
    parser.add_argument("--recompute-raw", action="store_true", help="raw recomputed from the records' components by the current ragas_judge combination (the records' own evaluator version then differs by the combination only)")
    parser.add_argument("--kind", choices=("platt", "isotonic"), default="platt", help="the calibration written (both are cross-validated and reported)")
    parser.add_argument("--evaluate", type=Path, default=None, help="a calibration file to evaluate on held-out rows (fits nothing)")
    parser.add_argument("--held-out", default=FIT_ROWS, help="with --evaluate: SET=N, the first N rows of each set were the fit's; the rest are evaluated")
    parser.add_argument("--balanced", action="store_true", help="class-balanced Platt fit: the map is the evidence (log likelihood ratio), the prior is stated apart (--prior)")
    parser.add_argument("--prior", type=float, default=None, help="the production prior the calibration states (with --balanced; docs/calibration.md gives its source)")
    parser.add_argument("--fit-rows", default=FIT_ROWS, help="SET=N: the fit uses the first N rows of each set (the benchmark's hash order) and nothing else, so the rest stays held out ('all': every record)")
    args = parser.parse_args(argv)

    records = load(args.records, args.config)
    if args.from_parts:
        from benchmarks.quality import SETS, from_parts, load_items, read_records

        derived = from_parts(read_records(args.records), load_items(SETS))
        records = [r for r in derived.get(args.config, []) if r.get("raw") is not None]
    if args.recompute_raw:
        from benchmarks.quality import SETS, load_items, recompute_ragas_judge

        records = recompute_ragas_judge(records, load_items(SETS))
    if args.evaluate is not None:
        return evaluate_held_out(records, args.evaluate, parse_rows(args.held_out))
    if args.fit_rows != "all":
        from benchmarks.quality import load_items

        fit = {(it["set"], it["id"]) for name, limit in parse_rows(args.fit_rows).items() for it in load_items([name], limit)}
        records = [r for r in records if (r["set"], r["id"]) in fit]
        print(f"fitting on {len(records)} records of the first rows {args.fit_rows}")
    raw = np.asarray([r["raw"] for r in records], dtype=float)
    labels = np.asarray([int(r["label"]) for r in records])
    groups = [f"{r['set']}:{r['id']}" for r in records]
    sets = np.asarray([r["set"] for r in records])
    settings = Settings.resolve(environ={}, llm="local", embeddings="local", method=args.config.split(":")[0])
    engine = Engine(settings)
    models = engine.models
    fingerprint = engine.raw_fingerprint(settings, models)
    expected_version = evaluator_version(fingerprint, None, DEFAULT_THRESHOLDS)
    versions = {r.get("evaluator_version") for r in records}
    if versions != {expected_version} and not (args.recompute_raw or args.from_parts):
        print(f"records were scored by evaluator(s) {sorted(map(str, versions))}, the uncalibrated default is {expected_version}: rerun the benchmark", file=sys.stderr)
        return 2

    report: dict[str, Any] = {"config": args.config, "rows": len(records), "positives": int(labels.sum()), "auroc_raw": round(auroc(raw, labels), 3), "kinds": {}}
    for kind in ("platt", "isotonic"):
        probs = cross_validated(raw, labels, kind, folds=5, groups=groups)
        entry = {
            "pooled": summary(probs, labels, np.ones(len(labels), bool)),
            "human": summary(probs, labels, sets == "human"),
            "pairs": summary(probs, labels, np.isin(sets, ["pairs_en", "pairs_zh"])),
            "wikieval": summary(probs, labels, sets == "wikieval"),
            "label_balanced_accuracy_human": round(balanced_accuracy(probs[sets == "human"] >= PROBABILITY_THRESHOLDS[0], labels[sets == "human"]), 3) if (sets == "human").any() else None,
            "label_balanced_accuracy_pooled": round(balanced_accuracy(probs >= PROBABILITY_THRESHOLDS[0], labels), 3),
            "reliability": reliability_table(probs, labels),
        }
        report["kinds"][kind] = entry
        print(f"{kind:8s} cross-validated ECE: pooled {entry['pooled']['ece']:.3f}, human {entry['human'].get('ece', float('nan')):.3f}, pairs {entry['pairs'].get('ece', float('nan')):.3f}; label balanced accuracy pooled {entry['label_balanced_accuracy_pooled']:.3f}, human {entry['label_balanced_accuracy_human']}")
    chosen = args.kind
    sources = sorted(set(sets.tolist()))
    calibration, _ = fit_evaluator_calibration(
        raw,
        labels,
        chosen,
        method=settings.method,
        models=(models.llm.name, models.embedder.name if models.embedder else ""),
        raw_fingerprint=fingerprint,
        source="../shared/data dev sets: " + ", ".join(sources) + f" (benchmarks/fit_calibration.py; first rows {args.fit_rows})",
        folds=5,
        groups=groups,
        balanced=args.balanced,
        prior=args.prior,
        **({"prior_source": PRIOR_SOURCE} if args.prior is not None else {}),
    )
    report["chosen"] = chosen
    report["fingerprint"] = fingerprint
    out = args.out or SHIPPED / f"{settings.method}-local.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(calibration.to_json() + "\n", encoding="utf-8")
    args.report.write_text(json.dumps(report, indent=1), encoding="utf-8")
    grid = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    print(f"written {chosen}: {out}; raw -> probability: " + ", ".join(f"{x:.2f}->{float(calibration(x)):.2f}" for x in grid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
