"""Alert rules on simulated production traffic: a healthy app's day, then a rise of hedges.

The traffic is drawn from the default's recorded results (no model call): single-turn answers
from ``results/production_mix_rows.json`` (``python -m benchmarks.production_mix``) and, for a
chat app, right answers to follow-up turns from ``results/multiturn_records.jsonl``
(``python -m benchmarks.multiturn``). :func:`production_traffic_test` writes a ``promtool test
rules`` document; ``tests/test_alerting.py`` runs it against the shipped rules, and this
module's ``main`` measures which alerts fire on a healthy chat app's day as the share of
follow-up turns grows::

    python -m benchmarks.alert_traffic          # writes results/chat_alerts.json

For each share of follow-up turns and each way they are judged (in their conversation, or the
last turn alone), over several seeds: the share of days on which each alert fired while the
traffic was healthy, and the healthy traffic's share of answers labelled ``does_not_address`` or
``somewhat_related`` (what ``RelevancyLowLabelShareHigh`` reads).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import yaml

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RULES = HERE.parent / "collector-config" / "prometheus" / "relevancy.rules.yml"


#: The alerts a rise of hedges to 30% of the answers must raise (the others watch failures).
HEDGE_RISE_ALERTS = ("RelevancyHedgeShareRising", "RelevancyLowLabelShareHigh", "RelevancyLowLabelShareRising", "RelevancyScoreDrop")


def follow_up_rows(config: str = "history") -> list[dict]:
    """The default's recorded results on right answers to follow-up turns, judged in their
    conversation (``benchmarks/results/multiturn_records.jsonl``, config ``history``): score,
    label and failure kind of each."""
    path = RESULTS / "multiturn_records.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["config"] == config and r["cand"] == "answer" and r["status"] == "scored"]


def production_traffic_test(seed: int, minutes_healthy: int, minutes_hedges: int, per_minute: int = 4, follow_up_share: float = 0.0, follow_up_config: str = "history", rules: Path = RULES) -> dict:
    """A ``promtool test rules`` document: the shipped rules over a service whose scored answers
    are drawn from the default's recorded results on the development sets
    (``benchmarks/results/production_mix_rows.json``: score, label and failure kind of each
    answer, calibrated at the shipped prior), ``per_minute`` a minute. Healthy traffic first:
    a reference answer (a person judged it relevant) with the prior's probability, else a
    variant of a uniformly drawn kind (echo, hedge, evasive, off-topic, padded, incomplete).
    A chat app's traffic (``follow_up_share`` > 0): that share of the turns are follow-ups,
    whose good answers (again with the prior's probability) are drawn from the right answers
    to follow-up turns (:func:`follow_up_rows`: judged in their conversation, or for
    ``follow_up_config="last_turn"`` as the last turn alone).
    Then the same traffic with 30% of the answers replaced by hedges (the retriever misses).
    The series are those the app's Prometheus exporter writes: the score histogram's ``_sum``
    and ``_count`` and ``relevancy_evaluations_total`` by label and failure kind."""
    data = json.loads((RESULTS / "production_mix_rows.json").read_text())
    rows = [r for r in data["rows"] if r["set"] != "human"]
    references = [r for r in rows if r["kind"] == "reference"]
    variants = {kind: [r for r in rows if r["kind"] == kind] for kind in ("echo", "hedge", "evasive", "off_topic", "padded", "incomplete")}
    follow_ups = follow_up_rows(follow_up_config) if follow_up_share else []
    rng = random.Random(seed)

    def healthy() -> dict:
        if rng.random() < data["prior"]:
            return rng.choice(follow_ups) if follow_ups and rng.random() < follow_up_share else rng.choice(references)
        return rng.choice(variants[rng.choice(sorted(variants))])

    labels = 'service_name="shop",span_name="answer",relevancy_evaluator_version="v1"'
    count = total = 0.0
    by_label: dict[tuple, float] = {}
    counters: dict[tuple, list[float]] = {}  # (label, failure kind) -> cumulative count per minute
    counts, sums = [], []
    minutes = minutes_healthy + minutes_hedges
    for minute in range(minutes + 1):
        for _ in range(per_minute if minute else 0):
            row = rng.choice(variants["hedge"]) if minute > minutes_healthy and rng.random() < 0.3 else healthy()
            count += 1
            total += row["score"]
            key = (row["label"], row["failure_kind"])
            by_label[key] = by_label.get(key, 0.0) + 1
        for key, value in by_label.items():
            counters.setdefault(key, [0.0] * minute).append(value)
        counts.append(count)
        sums.append(round(total, 4))
    series = [
        {"series": f"relevancy_score_count{{{labels}}}", "values": " ".join(f"{v:g}" for v in counts)},
        {"series": f"relevancy_score_sum{{{labels}}}", "values": " ".join(f"{v:g}" for v in sums)},
    ]
    for (label, kind), values in sorted(counters.items(), key=str):
        kind_label = f',relevancy_failure_kind="{kind}"' if kind else ""
        series.append({"series": f'relevancy_evaluations_total{{service_name="shop",span_name="answer",relevancy_status="scored",relevancy_label="{label}"{kind_label}}}', "values": " ".join(f"{v:g}" for v in values)})
    firing = 'count by (alertname) (max_over_time(ALERTS{alertstate="firing"}[%dm]))'
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    # no alert fired at any minute of the healthy day (the baseline's first day included)
                    {"expr": firing % minutes_healthy, "eval_time": f"{minutes_healthy}m", "exp_samples": []},
                    # 90 minutes into the rise: each of these has fired (at most 30m + 15m `for` after crossing)
                    {"expr": firing % 90, "eval_time": f"{minutes_healthy + 90}m", "exp_samples": [{"labels": f'{{alertname="{name}"}}', "value": 1} for name in HEDGE_RISE_ALERTS]},
                ],
            }
        ],
    }


LOW_LABELS = ("does_not_address", "somewhat_related")


def healthy_low_share(follow_up_share: float, follow_up_config: str = "history") -> float:
    """The expected share of a healthy day's answers labelled ``does_not_address`` or
    ``somewhat_related`` (the mix of :func:`production_traffic_test`)."""
    data = json.loads((RESULTS / "production_mix_rows.json").read_text())
    rows = [r for r in data["rows"] if r["set"] != "human"]
    low = lambda group: sum(r["label"] in LOW_LABELS for r in group) / len(group)  # noqa: E731
    references = [r for r in rows if r["kind"] == "reference"]
    kinds = sorted({r["kind"] for r in rows} - {"reference"})
    variants = sum(low([r for r in rows if r["kind"] == kind]) for kind in kinds) / len(kinds)
    good = (1 - follow_up_share) * low(references) + follow_up_share * low(follow_up_rows(follow_up_config))
    return data["prior"] * good + (1 - data["prior"]) * variants


def fired_on_healthy_day(seed: int, follow_up_share: float, follow_up_config: str, promtool: str) -> list[str]:
    """The alerts that fired at any minute of a simulated healthy day (26 h, 4 answers a minute)."""
    document = production_traffic_test(seed, minutes_healthy=26 * 60, minutes_hedges=0, follow_up_share=follow_up_share, follow_up_config=follow_up_config)
    test = document["tests"][0]
    test["promql_expr_test"] = test["promql_expr_test"][:1]  # the healthy day's check only
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
        yaml.safe_dump(document, handle, width=10**9)
    try:
        result = subprocess.run([promtool, "test", "rules", handle.name], capture_output=True, text=True, timeout=600)
    finally:
        Path(handle.name).unlink()
    if result.returncode == 0:
        return []
    fired = sorted(set(re.findall(r'alertname="(\w+)"', result.stdout + result.stderr)))
    if not fired:
        raise RuntimeError(f"promtool failed: {(result.stdout + result.stderr)[-2000:]}")
    return fired


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shares", default="0,0.2,0.35,0.5,0.65,0.8", help="shares of follow-up turns")
    parser.add_argument("--configs", default="history,last_turn")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "chat_alerts.json")
    args = parser.parse_args(argv)
    promtool = shutil.which("promtool")
    if not promtool:
        parser.error("promtool is not on PATH (bash .ci/system-deps installs it)")
    runs = []
    for config in [c.strip() for c in args.configs.split(",") if c.strip()]:
        for share in [float(s) for s in args.shares.split(",")]:
            if share == 0 and config != "history":
                continue  # no follow-up turns: the same traffic whatever the config
            days = [fired_on_healthy_day(seed, share, config, promtool) for seed in range(1, args.seeds + 1)]
            alerts = sorted({name for day in days for name in day})
            runs.append(
                {
                    "follow_up_share": share,
                    "follow_ups_judged": config,
                    "days": len(days),
                    "low_label_share": round(healthy_low_share(share, config), 4),
                    "fired": {name: sum(name in day for day in days) for name in alerts},
                }
            )
            print(json.dumps(runs[-1]), flush=True)
    follow_ups = {config: len(follow_up_rows(config)) for config in ("history", "last_turn")}
    args.out.write_text(json.dumps({"follow_up_answers": follow_ups, "seeds": args.seeds, "runs": runs}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
