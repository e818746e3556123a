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

**The prior.** A map fitted on labelled rows carries their share of relevant answers (its *base
rate*) into every probability. Production traffic has its own share, mostly relevant answers.
So a calibration separates the two (Saerens, Latinne and Decaestecker 2002, "Adjusting the
outputs of a classifier to new a priori probabilities"; Elkan 2001, "The foundations of
cost-sensitive learning", theorem 2):

* the **evidence**: ``log LR(raw) = logit(map(raw)) - logit(base_rate)``, the log likelihood
  ratio ``log P(raw | relevant) / P(raw | not relevant)``, which no prior enters. A
  class-balanced fit (``balanced=True``: each class weighs half) has ``base_rate = 0.5``;
* the **prior** ``pi``, the share of relevant answers in the traffic being scored: the reported
  probability is ``sigmoid(log LR(raw) + logit(pi))`` (:meth:`Calibration.apply`).

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
        base_rate: the share of relevant answers the map's probabilities assume, in (0, 1):
            0.5 for a class-balanced fit; for a file without it, ``fitted_on``'s
            ``positives / rows`` (the fit rows' share), else no prior shift is possible.
        prior: the production prior this calibration states, in (0, 1) (the share of relevant
            answers in the traffic it is meant for), with its source in ``fitted_on``; used
            when the ``relevancy_prior`` setting is unset. None: the base rate.
    """

    kind: str
    params: dict[str, Any]
    method: str = ""
    models: tuple[str, ...] = ()
    fitted_on: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    base_rate: Optional[float] = None
    prior: Optional[float] = None

    def __post_init__(self) -> None:
        if self.base_rate is None and self.fitted_on.get("rows") and self.fitted_on.get("positives") is not None:
            rows, positives = int(self.fitted_on["rows"]), int(self.fitted_on["positives"])
            if 0 < positives < rows:
                object.__setattr__(self, "base_rate", positives / rows)
        for name in ("base_rate", "prior"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                raise ValueError(f"calibration {name} must lie strictly between 0 and 1; got {value!r}")
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

    def __call__(self, raw: float, prior: Optional[float] = None) -> float:
        """The probability (0..1) for one raw score under ``prior`` (see :meth:`apply`)."""
        return float(self.apply(np.asarray([raw], dtype=np.float64), prior)[0])

    def _base_logit(self, values: np.ndarray) -> np.ndarray:
        """logit of the map's own probability (at its base rate), clipped to +-36."""
        if self.kind == "platt":
            z = self.params["a"] * values + self.params["b"]
        else:
            p = np.clip(np.interp(values, np.asarray(self.params["x"]), np.asarray(self.params["y"])), 1e-12, 1 - 1e-12)
            z = np.log(p) - np.log1p(-p)
        return np.clip(z, -36.0, 36.0)

    def evidence(self, raw: Any) -> np.ndarray:
        """The log likelihood ratio ``log P(raw | relevant) / P(raw | not relevant)`` (natural
        log, same shape as ``raw``): the map's logit less its base rate's. Prior-free: the labels
        are read from it. Without a base rate (an old file without row counts) the map's logit."""
        z = self._base_logit(np.asarray(raw, dtype=np.float64))
        return z - _logit(self.base_rate) if self.base_rate is not None else z

    def apply(self, raw: Any, prior: Optional[float] = None) -> np.ndarray:
        """Probabilities for an array of raw scores (same shape, float64, in [0, 1]):
        ``sigmoid(evidence(raw) + logit(prior))``.

        ``prior``: the share of relevant answers in the scored traffic, in (0, 1); None: the
        calibration's stated :attr:`prior`, else its base rate (the map as fitted)."""
        values = np.asarray(raw, dtype=np.float64)
        prior = prior if prior is not None else self.prior
        z = self._base_logit(values)
        if prior is not None and self.base_rate is not None:
            z = z - _logit(self.base_rate) + _logit(prior)
        return 1.0 / (1.0 + np.exp(-z))

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = list(self.models)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    def effective_prior(self, prior: Optional[float] = None) -> Optional[float]:
        """The prior :meth:`apply` uses for ``prior`` (None when no shift applies)."""
        if self.base_rate is None:
            return None
        return prior if prior is not None else (self.prior if self.prior is not None else self.base_rate)

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
            base_rate=data.get("base_rate"),
            prior=data.get("prior"),
        )

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Calibration":
        """Read a calibration JSON file. Raises OSError or ValueError."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def fingerprint(self) -> str:
        """A canonical string of the map itself (kind and parameters), for evaluator versions."""
        return json.dumps({"kind": self.kind, "params": self.params, "base_rate": self.base_rate}, sort_keys=True, separators=(",", ":"))


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


# ---------------------------------------------------------------------------------- fitting


def fit_platt(raw: Sequence[float], labels: Sequence[int], *, iterations: int = 100, balanced: bool = False) -> dict[str, float]:
    """Platt scaling: ``(a, b)`` maximising the likelihood of ``sigmoid(a * raw + b)``.

    Uses Platt's smoothed targets (robust for separable or tiny sets) and Newton's method with a
    small ridge term; raises ValueError when both classes are not present. ``balanced``: each
    class weighs half of the likelihood whatever its count, so ``sigmoid(a * raw + b)`` is the
    probability at a base rate of 0.5 and ``a * raw + b`` the log likelihood ratio.
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    positives, negatives = float(y.sum()), float(len(y) - y.sum())
    if positives == 0 or negatives == 0:
        raise ValueError("calibration needs labels of both classes (0 and 1)")
    target = np.where(y > 0.5, (positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0))
    weight = np.where(y > 0.5, len(y) / (2.0 * positives), len(y) / (2.0 * negatives)) if balanced else np.ones_like(y)
    design = np.stack([x, np.ones_like(x)], axis=1)
    theta = np.array([0.0, 0.0 if balanced else math.log((negatives + 1.0) / (positives + 1.0)) * -1.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ theta, -500, 500)))
        gradient = design.T @ (weight * (p - target))
        weights = weight * p * (1.0 - p)
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


def fit_calibration(raw: Sequence[float], labels: Sequence[int], kind: str = "platt", *, balanced: bool = False, prior: Optional[float] = None, **provenance: Any) -> Calibration:
    """Fit a :class:`Calibration` of ``kind`` (``platt`` or ``isotonic``) on raw scores and 0/1
    labels; ``provenance`` fills the other fields (method, models, fitted_on, metrics).

    ``balanced`` (Platt only): a class-balanced fit (base rate 0.5: the map is the evidence);
    otherwise the base rate is the rows' share of label 1. ``prior``: the stated production
    prior in (0, 1) recorded in the calibration (None: the base rate applies).
    Raises ValueError for an unknown kind, one class only, or ``balanced`` with isotonic."""
    y = np.asarray(labels, dtype=np.float64)
    if kind == "platt":
        params: dict[str, Any] = fit_platt(raw, labels, balanced=balanced)
    elif kind == "isotonic":
        if balanced:
            raise ValueError("a class-balanced fit is available for platt calibrations only")
        params = fit_isotonic(raw, labels)
    else:
        raise ValueError(f"calibration kind must be one of {', '.join(CALIBRATION_KINDS)}; got {kind!r}")
    share = float(y.mean()) if y.size else 0.5
    base_rate = 0.5 if balanced else (share if 0.0 < share < 1.0 else None)
    models = tuple(provenance.pop("models", ()))
    return Calibration(kind=kind, params=params, models=models, base_rate=base_rate, prior=prior, **provenance)


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
    balanced: bool = False,
    prior: Optional[float] = None,
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
        balanced: a class-balanced Platt fit (the map is the evidence, base rate 0.5).
        prior: the production prior the calibration states (default: the rows' share of
            label 1 when ``balanced``, so scores hold for traffic like the rows).
        fitted_on: more provenance recorded under ``fitted_on`` (e.g. ``label_column``).

    Returns:
        (the calibration, whose ``metrics`` hold the raw score's AUROC, the cross-validated
        expected calibration error (at the rows' own share of label 1) and ``folds``; the
        cross-validated probabilities, shape (n,)).

    Raises:
        ValueError: an unknown ``kind``.
    """
    x = np.asarray(raw, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    share = float(y.mean())
    if balanced and prior is None and 0.0 < share < 1.0:
        prior = share
    cv = cross_validated(x, y, kind, folds=folds, groups=groups, balanced=balanced)
    calibration = fit_calibration(
        x,
        y,
        kind,
        balanced=balanced,
        prior=prior,
        method=method,
        models=tuple(models),
        fitted_on={"raw_fingerprint": raw_fingerprint, "source": source, "rows": int(len(x)), "positives": int(y.sum()), **fitted_on},
        metrics={"auroc": round(auroc(x, y), 4), "ece_cross_validated": round(expected_calibration_error(cv, y), 4), "folds": folds},
    )
    return calibration, cv


def cross_validated(raw: Sequence[float], labels: Sequence[int], kind: str = "platt", folds: int = 5, seed: int = 0, groups: Optional[Sequence[Any]] = None, balanced: bool = False) -> np.ndarray:
    """Out-of-fold calibrated probabilities: each row is mapped by a calibration fitted without
    its fold (stratified by label; rows sharing a ``group``, e.g. a question, stay together).
    ``balanced``: class-balanced fits, applied at the training fold's own share of label 1."""
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
        fitted = fit_calibration(x[train], y[train], kind, balanced=balanced)
        out[test] = fitted.apply(x[test], float(y[train].mean()) if balanced else None)
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


def reliability_table(probabilities: Sequence[float], labels: Sequence[int], bins: int = 10, weights: Optional[Sequence[float]] = None) -> list[dict[str, float]]:
    """Equal-width bins over [0, 1]: for each non-empty bin its range, count, mean predicted
    probability and observed share of label 1. ``weights`` (non-negative, one per row): a
    weighted population, e.g. rows re-weighted to a prior (:func:`prior_weights`); ``weight``
    is then each bin's share of the total weight."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 0.0, 1.0)
    y = np.asarray(labels, dtype=np.float64)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    index = np.minimum((p * bins).astype(int), bins - 1)
    total = float(w.sum())
    table = []
    for b in range(bins):
        mask = index == b
        if mask.any() and w[mask].sum() > 0:
            wm = w[mask]
            table.append({"low": b / bins, "high": (b + 1) / bins, "count": int(mask.sum()), "weight": float(wm.sum() / total), "mean_probability": float((wm * p[mask]).sum() / wm.sum()), "observed": float((wm * y[mask]).sum() / wm.sum())})
    return table


def expected_calibration_error(probabilities: Sequence[float], labels: Sequence[int], bins: int = 10, weights: Optional[Sequence[float]] = None) -> float:
    """ECE: the (weight- or count-) weighted mean |observed share - mean probability| over
    equal-width bins (Naeini et al. 2015)."""
    table = reliability_table(probabilities, labels, bins, weights)
    return float(sum(row["weight"] * abs(row["observed"] - row["mean_probability"]) for row in table)) if table else float("nan")


def prior_weights(labels: Sequence[int], prior: float) -> np.ndarray:
    """Row weights that give label 1 the share ``prior`` of the total (each class's rows
    equally): the rows re-weighted to a production prior. Raises ValueError without both
    classes."""
    y = np.asarray(labels, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        raise ValueError("prior weights need both classes")
    return np.where(y, prior / positives, (1.0 - prior) / negatives)


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
