"""Calibration: the fitting and measures against scikit-learn, the engine applying a calibration,
the evaluator version, and `relevancy-tracer calibrate` end to end against a real HTTP model
server."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relevancy_tracer.config import Settings
from relevancy_tracer.scoring.calibration import (
    Calibration,
    auroc,
    balanced_accuracy,
    cross_validated,
    expected_calibration_error,
    fit_calibration,
    fit_isotonic,
    fit_platt,
    reliability_table,
)
from relevancy_tracer.scoring.engine import Engine

from .conftest import fake_model_env, openai_settings, subprocess_env

sklearn = pytest.importorskip("sklearn", reason="scikit-learn is in the dev extra")


def _data(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = rng.random(n)
    labels = (rng.random(n) < raw).astype(int)  # P(label 1 | raw) = raw
    return raw, labels


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([round(0.05 * i, 2) for i in range(21)]), st.integers(0, 1)), min_size=2, max_size=60))
def test_isotonic_blocks_equal_scikit_learn(points):
    from sklearn.isotonic import IsotonicRegression

    raw = np.asarray([p[0] for p in points])
    labels = np.asarray([p[1] for p in points])
    params = fit_isotonic(raw, labels)
    fitted = np.repeat(params["y"], params["n"])  # block value of each row, in raw order
    expected = IsotonicRegression(out_of_bounds="clip").fit(raw, labels).predict(np.sort(raw))
    assert np.allclose(fitted, expected)
    assert all(b >= a for a, b in zip(params["y"], params["y"][1:]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 1), st.integers(0, 1)), min_size=2, max_size=50).filter(lambda p: len({x[1] for x in p}) == 2))
def test_auroc_equals_scikit_learn(points):
    from sklearn.metrics import roc_auc_score

    raw = [p[0] for p in points]
    labels = [p[1] for p in points]
    assert auroc(raw, labels) == pytest.approx(roc_auc_score(labels, raw))


def test_platt_matches_logistic_regression_and_is_calibrated():
    from sklearn.linear_model import LogisticRegression

    raw, labels = _data(1, 2000)
    params = fit_platt(raw, labels)
    reference = LogisticRegression(C=1e9).fit(raw[:, None], labels)
    assert params["a"] == pytest.approx(reference.coef_[0][0], rel=0.05)
    assert params["b"] == pytest.approx(reference.intercept_[0], rel=0.05, abs=0.05)
    probs = cross_validated(raw, labels, "platt")
    assert expected_calibration_error(probs, labels) < 0.05
    # the raw score itself is calibrated here, and a constant 0.5 is not
    assert expected_calibration_error(raw, labels) < 0.05 < expected_calibration_error(np.full(len(raw), 0.9), labels)


@pytest.mark.parametrize("kind", ["platt", "isotonic"])
def test_calibration_is_monotone_and_round_trips(kind, tmp_path):
    raw, labels = _data(2)
    calibration = fit_calibration(raw, labels, kind, method="ragas", models=("m1", "m2"), fitted_on={"rows": 400})
    grid = np.linspace(-1.5, 1.5, 301)
    probs = calibration.apply(grid)
    assert np.all(np.diff(probs) >= 0) and probs.min() >= 0 and probs.max() <= 1
    if kind == "platt":
        assert np.all(np.diff(probs) > 0)  # strictly increasing: no ties are created
    path = tmp_path / "calib.json"
    path.write_text(calibration.to_json())
    loaded = Calibration.load(path)
    assert loaded == calibration and loaded(0.3) == calibration(0.3)


@pytest.mark.parametrize(
    "document",
    [{"kind": "spline", "params": {}}, {"kind": "platt", "params": {"a": "x", "b": 1}}, {"kind": "isotonic", "params": {"x": [0.2, 0.1], "y": [0.1, 0.2]}}, {"params": {}}],
)
def test_malformed_calibrations_are_refused(document):
    with pytest.raises(ValueError):
        Calibration.from_dict(document)


def test_reliability_table_and_balanced_accuracy():
    table = reliability_table([0.05, 0.15, 0.95, 0.92], [0, 1, 1, 1])
    assert [(row["low"], row["count"]) for row in table] == [(0.0, 1), (0.1, 1), (0.9, 2)]
    assert table[1]["observed"] == 1.0 and table[2]["mean_probability"] == pytest.approx(0.935)
    assert balanced_accuracy([True, True, False, False], [1, 0, 0, 0]) == pytest.approx((1.0 + 2 / 3) / 2)


def test_engine_applies_a_calibration_and_versions_the_evaluator(server, tmp_path):
    raw_engine = Engine(openai_settings(server, calibration="none"))
    raw_result = raw_engine.score("Where is France and what is its capital?", "France is in western Europe and Paris is its capital.")
    assert raw_result.ok and not raw_result.calibrated and raw_result.score == raw_result.raw_score
    calibration = Calibration(kind="platt", params={"a": 4.0, "b": -2.0}, method="ragas")
    path = tmp_path / "calib.json"
    path.write_text(calibration.to_json())
    engine = Engine(openai_settings(server, calibration=str(path)))
    result = engine.score("Where is France and what is its capital?", "France is in western Europe and Paris is its capital.")
    assert result.ok and result.calibrated
    assert result.raw_score == pytest.approx(raw_result.raw_score)
    assert result.score == pytest.approx(calibration(result.raw_score))
    assert len(result.evaluator_version) == 12 and result.evaluator_version != raw_result.evaluator_version
    # calibrated scores are labelled with the probability thresholds
    assert result.label == ("directly_addresses" if result.score >= 0.5 else "partially_addresses" if result.score >= 0.3 else "somewhat_related" if result.score >= 0.15 else "does_not_address")
    # another method, or other prompts' settings, is another evaluator; a failure still carries it
    other = engine.score("Where is France?", "France is in western Europe.", method="direct")
    assert other.evaluator_version not in (result.evaluator_version, None)
    failed = engine.score("", "France is in western Europe.")
    assert failed.status == "invalid_input" and failed.evaluator_version == result.evaluator_version


def test_unknown_calibration_path_is_a_bad_argument_and_a_bad_env_value_falls_back(monkeypatch, tmp_path):
    with pytest.raises(ValueError):
        Settings.resolve(llm="openai", embeddings="openai", calibration=str(tmp_path / "missing.json"))
    monkeypatch.setenv("RELEVANCY_TRACER_CALIBRATION", str(tmp_path / "missing.json"))
    assert Settings.resolve(llm="openai", embeddings="openai").calibration == "auto"


def test_calibrate_cli_fits_prints_and_the_score_command_uses_it(server, tmp_path):
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_LLM_MAX_RETRIES="0", RELEVANCY_TRACER_METHOD="ragas")
    questions = [f"What is the capital of country number {i} and where is it?" for i in range(40)]
    rows = []
    for i, q in enumerate(questions):
        if i % 2:
            rows.append({"question": q, "answer": f"The capital of country number {i} is City {i}, in the north.", "label": 1})
        else:
            rows.append({"question": q, "answer": f"Bananas are yellow fruit rich in potassium {i}.", "label": 0 if i % 10 else 1})
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    calib = tmp_path / "calib.json"
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "calibrate", str(data), "-o", str(calib), "--no-progress"], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "expected calibration error" in proc.stdout and "reliability" in proc.stdout and "AUROC" in proc.stdout
    fitted = Calibration.load(calib)
    assert fitted.kind == "platt" and fitted.params["a"] > 0 and fitted.fitted_on["rows"] == 40 and fitted.fitted_on["positives"] == 24
    assert fitted.metrics["auroc"] > 0.8 and len(fitted.fitted_on["raw_fingerprint"]) == 64
    # class-balanced: the map is the evidence; the rows' share of relevant answers is the stated prior
    assert fitted.base_rate == 0.5 and fitted.prior == pytest.approx(24 / 40) and "prior: 0.600" in proc.stdout
    stated = tmp_path / "stated.json"
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "calibrate", str(data), "-o", str(stated), "--no-progress", "--prior", "0.9"], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert Calibration.load(stated).prior == 0.9 and Calibration.load(stated).params == pytest.approx(fitted.params)
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "calibrate", str(data), "-o", str(stated), "--no-progress", "--prior", "1.5"], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "--prior must lie strictly between 0 and 1" in proc.stderr
    out = tmp_path / "scored.jsonl"
    proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "score", str(data), "-o", str(out), "--no-progress", "--calibration", str(calib)], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["calibrated"] and r["score"] == pytest.approx(fitted(r["raw_score"]), abs=1e-6) for r in scored)
    relevant = [r["score"] for r in scored if "capital" in r["answer"]]
    irrelevant = [r["score"] for r in scored if "Bananas" in r["answer"]]
    assert min(relevant) > max(irrelevant)
    assert len({r["evaluator_version"] for r in scored}) == 1
    # the calibration was fitted for exactly these settings: no mismatch warning
    assert "fitted for another" not in proc.stderr


@pytest.mark.parametrize("method", [None, "ragas_judge"])
def test_the_shipped_calibration_applies_to_the_embedded_default(method):
    """The shipped calibration is matched by raw fingerprint (method, prompts, models, decoding):
    a change of any of them must come with a refitted one (benchmarks/fit_calibration.py), or
    the embedded default silently falls back to raw scores and raw-score thresholds. Models are
    built, not loaded. The same for the previous default, which ships its own."""
    overrides = {"method": method} if method else {}
    engine = Engine(Settings.resolve(llm="local", embeddings="local", calibration="auto", **overrides))
    calibration, thresholds, version = engine.identity(engine.settings, engine.models)
    assert calibration is not None, "no shipped calibration matches the default's raw fingerprint"
    assert calibration.method == engine.settings.method and calibration.fitted_on["raw_fingerprint"] == engine.raw_fingerprint()
    assert len(version) == 12
