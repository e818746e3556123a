"""The default against the previous defaults, pair by pair, from the records of
``benchmarks.quality`` (no model call).

Issue 24 asks that the default be at least as good as the previous default ``ragas_intent`` on
every perturbation kind beyond noise. The default ``ragas_judge_intent`` and ``ragas_intent``
(``0.2 * ragas + 0.8 * intent``) are made of the requests of two recorded runs, ``ragas_judge``
(the question conversation and its judge turn, the embeddings) and ``intent`` (the intent
statement and fulfilment judgement), so both are computed from those records
(:func:`benchmarks.quality.from_parts`)::

    python -m benchmarks.quality --configs "ragas_judge:calibration=none",intent --sets wikieval,pairs_en,pairs_zh
    python -m benchmarks.compare_default              # tables on stdout, JSON in results/

For each language and perturbation kind, on the rows where every method has records:
pairwise accuracy (the reference answer scored above the degraded one; ties 0.5) of the
default (raw score: the calibration is increasing, so it ranks alike), of ``ragas_intent``,
``ragas_judge`` (the default before), ``intent`` and the ``judge`` component, and a 95% paired
bootstrap interval of the default's accuracy minus ``ragas_intent``'s (2,000 resamples of
rows): an interval below 0 means worse beyond noise. WikiEval: its 10 dev pairs (good vs poor
answer).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from benchmarks import quality as Q
from relevancy_tracer.scoring.calibration import bootstrap_interval

Key = tuple[str, str, str]
DEFAULT, PREVIOUS = "ragas_judge_intent (default)", "ragas_intent (previous)"


def scorers(by_config: dict[str, dict[Key, dict]]) -> dict[str, Callable[[Key], Optional[float]]]:
    """Score functions over record keys: the default, ragas_intent, ragas_judge, intent, the judge component."""

    def raw(config: str) -> Callable[[Key], Optional[float]]:
        return lambda k: (by_config[config].get(k) or {}).get("raw")

    return {
        DEFAULT: raw("ragas_judge_intent"),
        PREVIOUS: raw("ragas_intent"),
        "ragas_judge": raw("ragas_judge"),
        "intent": raw("intent"),
        "judge component": lambda k: ((by_config["ragas_judge"].get(k) or {}).get("components") or {}).get("judge"),
    }


def accuracy(score: Callable[[Key], Optional[float]], rows: list[tuple[Key, Key]], idx: np.ndarray) -> float:
    """Pairwise accuracy over ``rows[idx]``; a missing score loses the pair."""
    wins = []
    for i in idx:
        a, b = (score(k) for k in rows[i])
        wins.append(0.0 if a is None or b is None else 1.0 if a > b else 0.5 if a == b else 0.0)
    return float(np.mean(wins))


def compare(records: list[dict], items: list[dict]) -> dict:
    latest = Q.latest_records(records)
    rj = Q.recompute_ragas_judge([r for r in latest if r["config"] == "ragas_judge"], items)
    keyed = lambda rs: {(r["set"], r["id"], r["cand"]): r for r in rs}  # noqa: E731
    by_config = {"ragas_judge": keyed(rj), "intent": keyed(r for r in latest if r["config"] == "intent")}
    by_config.update({name: keyed(rs) for name, rs in Q.from_parts(latest, items).items()})
    fns = scorers(by_config)
    scored = {k for k, r in by_config["ragas_judge_intent"].items() if r.get("raw") is not None}
    out: dict = {}
    for lang in ("pairs_en", "pairs_zh", "wikieval"):
        kinds = ("poor_answer",) if lang == "wikieval" else Q.PERTURBATIONS
        refs = sorted({k[1] for k in scored if k[0] == lang and k[2] == "answer"})
        for kind in kinds:
            rows = [((lang, i, "answer"), (lang, i, kind)) for i in refs if (lang, i, kind) in scored]
            if not rows:
                continue
            idx = np.arange(len(rows))
            entry = {"n": len(rows), "references_scored": len(refs)}
            for name, fn in fns.items():
                entry[name] = round(accuracy(fn, rows, idx), 3)
            low, high = bootstrap_interval(lambda ix: accuracy(fns[DEFAULT], rows, ix) - accuracy(fns[PREVIOUS], rows, ix), len(rows))
            entry["default_minus_previous_ci"] = [round(low, 3), round(high, 3)]
            out.setdefault(lang, {})[kind] = entry
    return out


def markdown(result: dict) -> str:
    names = [DEFAULT, PREVIOUS, "ragas_judge", "intent", "judge component"]
    lines = []
    for lang, kinds in result.items():
        lines += [f"#### {lang}", "", "| kind | rows | " + " | ".join(names) + " | default - previous [95% CI] |", "| --- | ---: |" + " --- |" * (len(names) + 1)]
        for kind, e in kinds.items():
            low, high = e["default_minus_previous_ci"]
            lines.append(f"| {kind.replace('_answer', '')} | {e['n']} | " + " | ".join(f"{e[n]:.2f}" for n in names) + f" | {e[names[0]] - e[names[1]]:+.2f} [{low:+.2f}, {high:+.2f}] |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, default=Q.RESULTS / "quality_records.jsonl.gz")
    parser.add_argument("--out", type=Path, default=Q.RESULTS / "compare_default.json")
    args = parser.parse_args(argv)
    records = Q.read_records(args.records)
    items = Q.load_items(["pairs_en", "pairs_zh", "wikieval"])
    result = compare(records, items)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
