"""The default against the previous default, pair by pair, from the records of
``benchmarks.quality`` (no model call).

Issue 24 asks that the default be at least as good as the previous default ``ragas_intent`` on
every perturbation kind beyond noise. ``ragas_intent`` is ``0.2 * ragas + 0.8 * intent``
(``scoring.methods``); its ``ragas`` component is the same computation as the default's
(the same question-generation request, embeddings and noncommittal rule), so it is taken from
the default's records, and ``intent`` from the records of the ``intent`` method (the same
requests ``ragas_intent`` makes for it)::

    python -m benchmarks.quality --configs intent --sets wikieval,pairs_en,pairs_zh
    python -m benchmarks.compare_default              # tables on stdout, JSON in results/

For each language and perturbation kind, on the rows where both methods have records:
pairwise accuracy (the reference answer scored above the degraded one; ties 0.5) of the
default (raw score: the calibration is increasing, so it ranks alike), of ``ragas_intent``,
``intent``, and the default's ``judge`` component, and a 95% paired bootstrap interval of
the default's accuracy minus ``ragas_intent``'s (2,000 resamples of rows): an interval below
0 means worse beyond noise. WikiEval: its 10 dev pairs (good vs poor answer).
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


def scorers(default: dict[Key, dict], intent: dict[Key, dict]) -> dict[str, Callable[[Key], Optional[float]]]:
    """Score functions over record keys: the default, ragas_intent, intent, the judge component."""

    def component(k: Key, name: str) -> Optional[float]:
        return (default[k].get("components") or {}).get(name)

    def ragas_intent(k: Key) -> Optional[float]:
        ragas, judged = component(k, "ragas"), intent[k].get("raw")
        return None if ragas is None or judged is None else 0.2 * ragas + 0.8 * judged

    return {
        "ragas_judge (default)": lambda k: default[k].get("raw"),
        "ragas_intent (previous)": ragas_intent,
        "intent": lambda k: intent[k].get("raw"),
        "judge component": lambda k: component(k, "judge"),
    }


def accuracy(score: Callable[[Key], Optional[float]], rows: list[tuple[Key, Key]], idx: np.ndarray) -> float:
    """Pairwise accuracy over ``rows[idx]``; a missing score loses the pair."""
    wins = []
    for i in idx:
        a, b = (score(k) for k in rows[i])
        wins.append(0.0 if a is None or b is None else 1.0 if a > b else 0.5 if a == b else 0.0)
    return float(np.mean(wins))


def compare(records: list[dict], items: list[dict]) -> dict:
    latest: dict[tuple, dict] = {}
    for r in records:
        latest[(r["config"], r["set"], r["id"], r["cand"])] = r
    rj = Q.recompute_ragas_judge([r for k, r in latest.items() if k[0] == "ragas_judge"], items)
    default = {(r["set"], r["id"], r["cand"]): r for r in rj}
    intent = {(k[1], k[2], k[3]): r for k, r in latest.items() if k[0] == "intent" and r.get("raw") is not None}
    fns = scorers(default, intent)
    base = fns["ragas_intent (previous)"]
    out: dict = {}
    for lang in ("pairs_en", "pairs_zh", "wikieval"):
        kinds = ("poor_answer",) if lang == "wikieval" else Q.PERTURBATIONS
        refs = sorted({k[1] for k in intent if k[0] == lang and k[2] == "answer" and k in default})
        for kind in kinds:
            rows = [((lang, i, "answer"), (lang, i, kind)) for i in refs if (lang, i, kind) in intent and (lang, i, kind) in default]
            if not rows:
                continue
            idx = np.arange(len(rows))
            entry = {"n": len(rows), "references_scored": len(refs)}
            for name, fn in fns.items():
                entry[name] = round(accuracy(fn, rows, idx), 3)
            low, high = bootstrap_interval(lambda ix: accuracy(fns["ragas_judge (default)"], rows, ix) - accuracy(base, rows, ix), len(rows))
            entry["default_minus_previous_ci"] = [round(low, 3), round(high, 3)]
            out.setdefault(lang, {})[kind] = entry
    return out


def markdown(result: dict) -> str:
    names = ["ragas_judge (default)", "ragas_intent (previous)", "intent", "judge component"]
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
