"""What people read on production traffic: the default's score, label and failure kind on the
development sets re-weighted to the stated prior, with confidence intervals.

Production traffic is mostly relevant answers. The pair sets hold one reference answer (a person
judges it relevant) per six degraded variants of known kind (echo, hedge, evasive, off-topic,
padded, incomplete), so their raw share of relevant answers is about 0.16. This benchmark
re-weights them so the reference answers carry the stated prior's share (0.8 by default), and
reports, for the shipped calibration of the default method (``ragas_judge_intent``):

* the expected calibration error of ``relevancy.score`` on that mix (weighted, 10 bins), with a
  95% bootstrap interval over questions, on every row and on the rows held out of the fit;
* the share of reference answers labelled ``directly_addresses``, and of each variant kind
  labelled below ``partially_addresses``;
* the failure kind of each variant: a confusion table per kind (:mod:`relevancy_tracer.scoring.failure`);
* the human set (people's judgements of real answers), re-weighted to the prior too.

No model call: the scores are the quality benchmark's records (``benchmarks.quality.from_parts``:
the ``ragas_judge`` and ``intent`` records of the same requests). The failure kind's two
example-sentence similarities are not in those records; they are computed with the embedded
embedder (the same unit vectors the method computes) and cached in
``benchmarks/results/refusal_similarities.json.gz`` (about a minute on 2 cores the first time).

    python -m benchmarks.production_mix            # writes benchmarks/results/production_mix.json
    python -m benchmarks.production_mix --prior 0.9

Also written: ``production_mix_rows.json``, one row per scored answer (set, kind, person's label,
raw score, score, label, failure kind), which the alert tests draw their metric series from.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

from relevancy_tracer.config import EVIDENCE_THRESHOLDS  # noqa: E402
from relevancy_tracer.scoring import failure  # noqa: E402
from relevancy_tracer.scoring.calibration import auroc, bootstrap_interval, expected_calibration_error, prior_weights  # noqa: E402
from relevancy_tracer.scoring.engine import interpret  # noqa: E402
from relevancy_tracer.scoring.evaluator import SHIPPED_DIR, load_calibration  # noqa: E402

from benchmarks.refusals import answer_key, refusal_components  # noqa: E402

#: Variant kind in the data -> failure kind.
KIND_OF = {
    "echo_answer": "echo",
    "hedge_answer": "hedge",
    "evasive_answer": "evasive",
    "off_topic_answer": "off_topic",
    "padded_answer": "padded",
    "incomplete_answer": "incomplete",
}
#: The fit subsets of the shipped calibration (benchmarks.fit_calibration --fit-rows).
FIT_ROWS = "pairs_en=30,pairs_zh=20,wikieval=10"


def scored_rows(records_path: Path, calibration_path: Path, prior: Optional[float]) -> list[dict]:
    """The default's records read as the engine reads them: score, evidence, label, failure kind."""
    from benchmarks.quality import SETS, from_parts, load_items, read_records

    items = load_items(SETS)
    texts = {(it["set"], it["id"], it["cand"]): it for it in items}
    records = [r for r in from_parts(read_records(records_path), items)["ragas_judge_intent"] if r.get("raw") is not None]
    refusals = refusal_components([texts[(r["set"], r["id"], r["cand"])]["answer"] for r in records], RESULTS / "refusal_similarities.json.gz")
    calibration = load_calibration(str(calibration_path))
    fit = {(it["set"], it["id"]) for part in FIT_ROWS.split(",") for name, limit in [part.split("=")] for it in load_items([name], int(limit))}
    rows = []
    for r in records:
        answer = texts[(r["set"], r["id"], r["cand"])]["answer"]
        components = dict(r["components"], **refusals[answer_key(answer)])
        score, evidence, used_prior, label, _, kind = interpret(r["raw"], calibration, EVIDENCE_THRESHOLDS, True, prior, components, r.get("similarities") or [], r.get("noncommittal") or [])
        rows.append(
            {
                "set": r["set"],
                "id": r["id"],
                "cand": r["cand"],
                "kind": KIND_OF.get(r["cand"], "reference" if r["label"] else "poor"),
                "relevant": int(r["label"]),
                "held_out": (r["set"], r["id"]) not in fit,
                "raw": round(r["raw"], 5),
                "score": round(score, 5),
                "evidence": round(evidence, 4),
                "label": label,
                "failure_kind": kind,
            }
        )
    return rows


def _share(rows: list[dict], test: Any) -> dict[str, Any]:
    if not rows:
        return {}
    hits = np.asarray([1.0 if test(r) else 0.0 for r in rows])
    groups = [r["id"] for r in rows]
    low, high = bootstrap_interval(lambda idx: float(hits[idx].mean()), len(rows), groups=groups)
    return {"n": len(rows), "share": round(float(hits.mean()), 3), "ci": [round(low, 3), round(high, 3)]}


def prior_ece(rows: list[dict], prior: float) -> dict[str, Any]:
    """ECE of the score on ``rows`` re-weighted so relevant answers hold ``prior`` of the weight,
    with a bootstrap interval over questions (weights recomputed in each resample)."""
    if len({r["relevant"] for r in rows}) < 2:
        return {}
    p = np.asarray([r["score"] for r in rows])
    y = np.asarray([r["relevant"] for r in rows])
    w = prior_weights(y, prior)

    def stat(idx: np.ndarray) -> float:
        return expected_calibration_error(p[idx], y[idx], weights=prior_weights(y[idx], prior))

    low, high = bootstrap_interval(stat, len(rows), groups=[f"{r['set']}:{r['id']}" for r in rows])
    mean_p = float((w * p).sum() / w.sum())
    out = {"n": len(rows), "ece": round(expected_calibration_error(p, y, weights=w), 3), "ci": [round(low, 3), round(high, 3)], "mean_score": round(mean_p, 3), "relevant_share": prior}
    if 0 < y.sum() < len(y):
        out["auroc"] = round(auroc(p, y), 3)
        out["mean_score_relevant"] = round(float(p[y == 1].mean()), 3)
    return out


def report(rows: list[dict], prior: float) -> dict[str, Any]:
    pairs = [r for r in rows if r["set"] in ("pairs_en", "pairs_zh", "wikieval")]
    out: dict[str, Any] = {"prior": prior, "evidence_thresholds": list(EVIDENCE_THRESHOLDS), "calibration": {}, "labels": {}, "failure_kinds": {}}
    for scope, keep in (("all", lambda r: True), ("held_out", lambda r: r["held_out"])):
        chosen = [r for r in pairs if keep(r)]
        out["calibration"][f"pairs_{scope}"] = prior_ece(chosen, prior)
        out["calibration"][f"human_{scope}"] = prior_ece([r for r in rows if r["set"] == "human" and keep(r)], prior)
        labels: dict[str, Any] = {"reference_directly_addresses": _share([r for r in chosen if r["kind"] == "reference"], lambda r: r["label"] == "directly_addresses")}
        for kind in KIND_OF.values():
            labels[f"{kind}_below_partially"] = _share([r for r in chosen if r["kind"] == kind], lambda r: r["label"] in ("somewhat_related", "does_not_address"))
            labels[f"{kind}_label_counts"] = dict(Counter(r["label"] for r in chosen if r["kind"] == kind))
        out["labels"][scope] = labels
        confusion: dict[str, Any] = {}
        for kind in KIND_OF.values():
            got = [r for r in chosen if r["kind"] == kind and r["failure_kind"] is not None]
            counts = Counter(r["failure_kind"] for r in got)
            confusion[kind] = {"n": len(got), "accuracy": round(counts[kind] / len(got), 3) if got else None, "counts": dict(counts), "directly_addresses": sum(1 for r in chosen if r["kind"] == kind and r["failure_kind"] is None)}
        out["failure_kinds"][scope] = confusion
    human = [r for r in rows if r["set"] == "human"]
    out["human_labels"] = {
        "relevant_directly_addresses": _share([r for r in human if r["relevant"]], lambda r: r["label"] == "directly_addresses"),
        "not_relevant_directly_addresses": _share([r for r in human if not r["relevant"]], lambda r: r["label"] == "directly_addresses"),
    }
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [f"Prior {out['prior']}; label thresholds on the log likelihood ratio {out['evidence_thresholds']}.", ""]
    lines += ["| rows | n | ECE at the prior [95% CI] | mean score | mean score of relevant | AUROC |", "| --- | ---: | --- | ---: | ---: | ---: |"]
    for name, c in out["calibration"].items():
        if c:
            lines.append(f"| {name} | {c['n']} | {c['ece']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] | {c['mean_score']:.2f} | {c.get('mean_score_relevant', float('nan')):.2f} | {c.get('auroc', float('nan')):.2f} |")
    lines += ["", "| answers | all rows [95% CI] | held-out rows [95% CI] |", "| --- | --- | --- |"]
    for key in out["labels"]["all"]:
        if key.endswith("_label_counts"):
            continue
        a, h = out["labels"]["all"][key], out["labels"]["held_out"][key]
        lines.append(f"| {key.replace('_', ' ')} | {a['share']:.2f} [{a['ci'][0]:.2f}, {a['ci'][1]:.2f}] (n={a['n']}) | {h['share']:.2f} [{h['ci'][0]:.2f}, {h['ci'][1]:.2f}] (n={h['n']}) |")
    kinds = list(failure.FAILURE_KINDS)
    lines += ["", "Failure kind given (rows) for each variant kind (columns: the kind found; all rows, labelled below directly_addresses):", "", "| variant | n | " + " | ".join(kinds) + " | accuracy | held-out accuracy |", "| --- | ---: | " + " | ".join("---:" for _ in kinds) + " | ---: | ---: |"]
    for kind, c in out["failure_kinds"]["all"].items():
        held = out["failure_kinds"]["held_out"][kind]["accuracy"]
        lines.append(f"| {kind} | {c['n']} | " + " | ".join(str(c["counts"].get(k, 0)) for k in kinds) + f" | {c['accuracy']:.2f} | {held:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prior", type=float, default=None, help="the production prior (default: the shipped calibration's)")
    parser.add_argument("--records", type=Path, default=RESULTS / "quality_records.jsonl.gz")
    parser.add_argument("--calibration", type=Path, default=SHIPPED_DIR / "ragas_judge_intent-local.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "production_mix.json")
    parser.add_argument("--rows-out", type=Path, default=RESULTS / "production_mix_rows.json")
    args = parser.parse_args(argv)
    calibration = load_calibration(str(args.calibration))
    prior = args.prior if args.prior is not None else calibration.effective_prior()
    rows = scored_rows(args.records, args.calibration, args.prior)
    out = report(rows, prior)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    args.rows_out.write_text(json.dumps({"prior": prior, "rows": [{k: r[k] for k in ("set", "kind", "relevant", "raw", "score", "label", "failure_kind")} for r in rows]}, separators=(",", ":")) + "\n", encoding="utf-8")
    print(markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
