"""Calibration: a method's raw score mapped to the probability that a person would judge the
answer as addressing the question, and the measures used to check it.

A raw relevancy score (a mean cosine similarity, a judge's expected rating, a weighted
combination) orders answers but means nothing on its own: 0.72 may be a good answer for one
method and a poor one for another. A :class:`Calibration` is a monotone map fitted on labelled
answers (label 1: a person judged that the answer addresses the question), so the reported score
is an estimate of ``P(label = 1 | raw score)``:

* ``platt``: ``1 / (1 + exp(-(a * raw + b)))`` (Platt 1999, "Probabilistic outputs for support
  vector machines", with his smoothed targets ``(n+ + 1) / (n+ + 2)`` and ``1 / (n- + 2)``),
  fitted by Newton's method. Strictly increasing for ``a > 0``: no two raw scores tie.
* ``isotonic``: the pool-adjacent-violators fit (Zadrozny and Elkan 2002, "Transforming
  classifier scores into accurate multiclass probability estimates"), applied by linear
  interpolation between the fitted blocks' mean raw scores, so scores stay strictly ordered
  wherever the fit increases.

A calibration is a small JSON document (``to_json``/``from_json``) that records what it was
fitted for (method, models, fingerprint of the evaluator) and the data it was fitted on, so it can
ship inside the package and be written by ``relevancy-tracer calibrate``.

The measures: :func:`auroc` (the Mann-Whitney statistic), :func:`expected_calibration_error`
and :func:`reliability_table` (equal-width bins, Naeini et al. 2015), :func:`balanced_accuracy`,
and :func:`bootstrap_interval` for percentile confidence intervals.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

CALIBRATION_KINDS = ("platt", "isotonic")


@dataclass(frozen=True)
class Calibration:
    """A fitted monotone map from raw score to probability (see the module docstring).

    Attributes:
        kind: ``platt`` or ``isotonic``.
        params: ``{"a": float, "b": float}`` for platt; ``{"x": [...], "y": [...]}`` (block
            mean raw scores, increasing, and their fitted probabilities, non-decreasing) for
            isotonic.
        method: the relevancy method whose raw score this maps (e.g. ``ragas_judge``).
        models: ``[llm, embedding model]`` names the raw scores came from.
        fitted_on: free-form provenance (data sets, row counts, label definition).
        metrics: measures of the fit (cross-validated ECE, AUROC, ...), informative only.
    """

    kind: str
    params: dict[str, Any]
    method: str = ""
    models: tuple[str, ...] = ()
    fitted_on: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in CALIBRATION_KINDS:
            raise ValueError(f"calibration kind must be one of {', '.join(CALIBRATION_KINDS)}; got {self.kind!r}")
        if self.kind == "platt":
            a, b = self.params.get("a"), self.params.get("b")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)):
                raise ValueError(f"platt calibration needs finite a and b; got {self.params!r}")
        else:
            x, y = self.params.get("x"), self.params.get("y")
            if not isinstance(x, list) or not isinstance(y, list) or len(x) != len(y) or not x:
                raise ValueError("isotonic calibration needs equal-length non-empty x and y lists")
            if any(b < a for a, b in zip(x, x[1:])) or any(b < a for a, b in zip(y, y[1:])):
                raise ValueError("isotonic calibration x and y must be non-decreasing")
            if not all(0.0 <= v <= 1.0 for v in y):
                raise ValueError("isotonic calibration y values must lie in [0, 1]")

    def __call__(self, raw: float) -> float:
        """The probability (0..1) for one raw score."""
        return float(self.apply(np.asarray([raw], dtype=np.float64))[0])

    def apply(self, raw: Any) -> np.ndarray:
        """Probabilities for an array of raw scores (same shape, float64, in [0, 1])."""
        values = np.asarray(raw, dtype=np.float64)
        if self.kind == "platt":
            z = self.params["a"] * values + self.params["b"]
            return 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))
        return np.interp(values, np.asarray(self.params["x"]), np.asarray(self.params["y"]))

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = list(self.models)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Calibration":
        """Raises ValueError for a malformed document."""
        if not isinstance(data, dict) or "kind" not in data or "params" not in data:
            raise ValueError("a calibration needs 'kind' and 'params'")
        return cls(
            kind=data["kind"],
            params=dict(data["params"]),
            method=str(data.get("method", "")),
            models=tuple(data.get("models", ())),
            fitted_on=dict(data.get("fitted_on", {})),
            metrics=dict(data.get("metrics", {})),
        )

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Calibration":
        """Read a calibration JSON file. Raises OSError or ValueError."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def fingerprint(self) -> str:
        """A canonical string of the map itself (kind and parameters), for evaluator versions."""
        return json.dumps({"kind": self.kind, "params": self.params}, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------- fitting


def fit_platt(raw: Sequence[float], labels: Sequence[int], *, iterations: int = 100) -> dict[str, float]:
    """Platt scaling: ``(a, b)`` maximising the likelihood of ``sigmoid(a * raw + b)``.

    Uses Platt's smoothed targets (robust for separable or tiny sets) and Newton's method with a
    small ridge term; raises ValueError when both classes are not present.
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    positives, negatives = float(y.sum()), float(len(y) - y.sum())
    if positives == 0 or negatives == 0:
        raise ValueError("calibration needs labels of both classes (0 and 1)")
    target = np.where(y > 0.5, (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0))
    design = np.stack([x, np.ones_like(x)], axis=1)
    theta = np.array([0.0, math.log((negatives + 1.0) / (positives + 1.0)) * -1.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ theta, -500, 500)))
        gradient = design.T @ (p - target)
        weights = p * (1.0 - p)
        hessian = design.T @ (design * weights[:, None]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        theta = theta - step
        if float(np.abs(step).max()) < 1e-10:
            break
    return {"a": float(theta[0]), "b": float(theta[1])}


def fit_isotonic(raw: Sequence[float], labels: Sequence[int]) -> dict[str, list[float]]:
    """Pool adjacent violators: non-decreasing block means of ``labels`` ordered by ``raw``.

    Returns ``{"x": block mean raw scores, "y": block label means, "n": block sizes}`` (ties in
    ``raw`` are pooled first). Raises ValueError for empty input.
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if x.size == 0:
        raise ValueError("calibration needs at least one labelled score")
    unique, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=y)
    # blocks of [sum of raw scores, sum of labels, count]; equal raw scores start as one block
    blocks: list[list[float]] = []
    for value, label_sum, count in zip(unique, sums, counts):
        blocks.append([float(value) * count, float(label_sum), float(count)])
        while len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]:
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    return {"x": [b[0] / b[2] for b in blocks], "y": [min(1.0, max(0.0, b[1] / b[2])) for b in blocks], "n": [int(b[2]) for b in blocks]}


def fit_calibration(raw: Sequence[float], labels: Sequence[int], kind: str = "platt", **provenance: Any) -> Calibration:
    """Fit a :class:`Calibration` of ``kind`` (``platt`` or ``isotonic``) on raw scores and 0/1
    labels; ``provenance`` fills the other fields (method, models, fitted_on, metrics)."""
    if kind == "platt":
        params: dict[str, Any] = fit_platt(raw, labels)
    elif kind == "isotonic":
        params = fit_isotonic(raw, labels)
    else:
        raise ValueError(f"calibration kind must be one of {', '.join(CALIBRATION_KINDS)}; got {kind!r}")
    models = tuple(provenance.pop("models", ()))
    return Calibration(kind=kind, params=params, models=models, **provenance)


def fit_evaluator_calibration(
    raw: Sequence[float],
    labels: Sequence[int],
    kind: str = "platt",
    *,
    method: str,
    models: Sequence[str],
    raw_fingerprint: str,
    source: str,
    folds: int = 5,
    groups: Optional[Sequence[Any]] = None,
    **fitted_on: Any,
) -> tuple[Calibration, np.ndarray]:
    """Fit the calibration of one evaluator from its labelled raw scores, with its provenance and
    its cross-validated quality: what ``relevancy-tracer calibrate`` writes and what
    ``benchmarks/fit_calibration.py`` ships.

    Args:
        raw: the evaluator's raw scores, shape (n,). labels: 0/1 human labels, shape (n,).
        kind: ``platt`` or ``isotonic``. method, models: the method and its (chat, embedding)
            model names. raw_fingerprint: the evaluator's raw fingerprint
            (``Engine.raw_fingerprint``): the calibration applies only to that evaluator.
        source: where the rows came from (a file name, a data set). folds: cross-validation
            folds (>= 2). groups: rows sharing a group (a question) stay in one fold.
        fitted_on: more provenance recorded under ``fitted_on`` (e.g. ``label_column``).

    Returns:
        (the calibration, whose ``metrics`` hold the raw score's AUROC, the cross-validated
        expected calibration error and ``folds``; the cross-validated probabilities, shape (n,)).

    Raises:
        ValueError: an unknown ``kind``.
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    cv = cross_validated(x, y, kind, folds=folds, groups=groups)
    calibration = fit_calibration(
        x,
        y,
        kind,
        method=method,
        models=tuple(models),
        fitted_on={"raw_fingerprint": raw_fingerprint, "source": source, "rows": int(len(x)), "positives": int(y.sum()), **fitted_on},
        metrics={"auroc": round(auroc(x, y), 4), "ece_cross_validated": round(expected_calibration_error(cv, y), 4), "folds": folds},
    )
    return calibration, cv


def cross_validated(raw: Sequence[float], labels: Sequence[int], kind: str = "platt", folds: int = 5, seed: int = 0, groups: Optional[Sequence[Any]] = None) -> np.ndarray:
    """Out-of-fold calibrated probabilities: each row is mapped by a calibration fitted without
    its fold (stratified by label; rows sharing a ``group``, e.g. a question, stay together)."""
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng(seed)
    keys = list(groups) if groups is not None else list(range(len(x)))
    unique = sorted(set(keys), key=str)
    # stratify groups by their majority label, then deal them round-robin into folds
    majority = {g: 0 for g in unique}
    for g, label in zip(keys, y):
        majority[g] += 1 if label else -1
    fold_of: dict[Any, int] = {}
    for cls in (True, False):
        members = [g for g in unique if (majority[g] > 0) == cls]
        rng.shuffle(members)
        for i, g in enumerate(members):
            fold_of[g] = i % folds
    assigned = np.asarray([fold_of[g] for g in keys])
    out = np.empty_like(x)
    for fold in range(folds):
        test = assigned == fold
        if not test.any():
            continue
        train = ~test
        out[test] = fit_calibration(x[train], y[train], kind).apply(x[test])
    return out


# ---------------------------------------------------------------------------------- measures


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve: P(score of a random positive > a random negative), ties 0.5
    (the Mann-Whitney U statistic / (n+ n-)). Raises ValueError without both classes."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUROC needs both classes")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks of ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def reliability_table(probabilities: Sequence[float], labels: Sequence[int], bins: int = 10) -> list[dict[str, float]]:
    """Equal-width bins over [0, 1]: for each non-empty bin its range, count, mean predicted
    probability and observed share of label 1."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 0.0, 1.0)
    y = np.asarray(labels, dtype=np.float64)
    index = np.minimum((p * bins).astype(int), bins - 1)
    table = []
    for b in range(bins):
        mask = index == b
        if mask.any():
            table.append({"low": b / bins, "high": (b + 1) / bins, "count": int(mask.sum()), "mean_probability": float(p[mask].mean()), "observed": float(y[mask].mean())})
    return table


def expected_calibration_error(probabilities: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """ECE: count-weighted mean |observed share - mean probability| over equal-width bins."""
    table = reliability_table(probabilities, labels, bins)
    total = sum(row["count"] for row in table)
    return float(sum(row["count"] * abs(row["observed"] - row["mean_probability"]) for row in table) / total) if total else float("nan")


def balanced_accuracy(predicted: Sequence[bool], labels: Sequence[int]) -> float:
    """Mean of the recall on label 1 and the recall on label 0."""
    pred = np.asarray(predicted, dtype=bool)
    y = np.asarray(labels, dtype=bool)
    recalls = [float((pred[y == cls] == cls).mean()) for cls in (True, False) if (y == cls).any()]
    return float(np.mean(recalls)) if recalls else float("nan")


def bootstrap_interval(statistic: Callable[[np.ndarray], float], n: int, *, resamples: int = 2000, level: float = 0.95, seed: int = 0, groups: Optional[Sequence[Any]] = None) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(indices)`` over ``n`` rows (resampling whole
    groups when ``groups`` is given). Resamples where the statistic fails are skipped."""
    rng = np.random.default_rng(seed)
    if groups is not None:
        keys = list(groups)
        members: dict[Any, list[int]] = {}
        for i, g in enumerate(keys):
            members.setdefault(g, []).append(i)
        units = list(members.values())
    else:
        units = [[i] for i in range(n)]
    values = []
    for _ in range(resamples):
        picks = rng.integers(0, len(units), len(units))
        indices = np.fromiter((i for u in picks for i in units[u]), dtype=np.int64)
        try:
            value = statistic(indices)
        except (ValueError, ZeroDivisionError):
            continue
        if math.isfinite(value):
            values.append(value)
    if not values:
        return float("nan"), float("nan")
    low, high = np.percentile(values, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(low), float(high)
