"""The score under a stated prior, labels from the evidence, and the failure kind (issue 33).

The quality tests read the default's recorded scores on the development sets (the quality
benchmark's records and the failure kind's cached example similarities, both in
benchmarks/results): no model call.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from relevancy_tracer.config import EVIDENCE_THRESHOLDS
from relevancy_tracer.scoring import failure
from relevancy_tracer.scoring.calibration import Calibration, expected_calibration_error, fit_calibration, prior_weights
from relevancy_tracer.scoring.engine import Engine, interpret
from relevancy_tracer.scoring.evaluator import SHIPPED_DIR, load_calibration

from .conftest import SHARED, openai_settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHIPPED = SHIPPED_DIR / "ragas_judge_intent-local.json"


def _sample(rng: np.random.Generator, n: int, share: float) -> tuple[np.ndarray, np.ndarray]:
    labels = (rng.random(n) < share).astype(int)
    raw = np.where(labels == 1, rng.normal(0.85, 0.05, n), rng.normal(0.6, 0.12, n))
    return raw, labels


def test_a_balanced_fit_gives_the_same_evidence_whatever_share_it_was_fitted_on():
    rng = np.random.default_rng(0)
    grid = np.linspace(0.5, 0.95, 10)
    evidences = []
    for share in (0.2, 0.5, 0.8):
        raw, labels = _sample(rng, 4000, share)
        evidences.append(fit_calibration(raw, labels, balanced=True).evidence(grid))
        unbalanced = fit_calibration(raw, labels)
        assert unbalanced.base_rate == pytest.approx(labels.mean())
    assert np.abs(evidences[0] - evidences[2]).max() < 0.6  # the prior is not in the evidence
    # an unbalanced fit's probabilities carry its rows' share; the balanced one's do not
    raw_low, labels_low = _sample(rng, 4000, 0.2)
    raw_high, labels_high = _sample(rng, 4000, 0.8)
    low = fit_calibration(raw_low, labels_low)
    assert low(0.8) < fit_calibration(raw_high, labels_high)(0.8) - 0.2


@pytest.mark.parametrize("prior", [0.2, 0.5, 0.8, 0.95])
def test_the_score_under_a_prior_is_calibrated_on_traffic_with_that_share(prior):
    rng = np.random.default_rng(1)
    raw, labels = _sample(rng, 3000, 0.3)
    calibration = fit_calibration(raw, labels, balanced=True)
    test_raw, test_labels = _sample(rng, 6000, prior)
    assert expected_calibration_error(calibration.apply(test_raw, prior), test_labels) < 0.04
    # and mis-stating the prior shows: the rows' own share 0.3 on traffic at 0.95
    if prior == 0.95:
        assert expected_calibration_error(calibration.apply(test_raw, 0.3), test_labels) > 0.08


def test_prior_shift_is_the_bayes_formula_and_an_old_file_is_read_as_fitted():
    c = Calibration(kind="platt", params={"a": 10.0, "b": -7.0}, base_rate=0.5, prior=0.8)
    for raw in (0.3, 0.7, 0.9):
        evidence = 10.0 * raw - 7.0
        assert float(c.evidence([raw])[0]) == pytest.approx(evidence)
        assert c(raw) == pytest.approx(1 / (1 + math.exp(-(evidence + math.log(4)))))
        assert c(raw, 0.5) == pytest.approx(1 / (1 + math.exp(-evidence)))
    old = Calibration.from_dict({"kind": "platt", "params": {"a": 10.0, "b": -7.0}, "fitted_on": {"rows": 100, "positives": 25}})
    assert old.base_rate == 0.25 and old.prior is None
    assert old(0.8) == pytest.approx(1 / (1 + math.exp(-1.0)))  # no prior given: the map as fitted
    assert old(0.8, 0.25) == pytest.approx(old(0.8))
    with pytest.raises(ValueError):
        Calibration(kind="platt", params={"a": 1.0, "b": 0.0}, prior=1.0)
    assert Calibration.from_dict(json.loads(c.to_json())) == c


def test_the_shipped_calibration_states_its_prior_and_its_source():
    shipped = load_calibration(str(SHIPPED))
    assert shipped.base_rate == 0.5 and shipped.prior == 0.8
    assert "ExpertQA" in shipped.fitted_on["prior_source"]


def _settings_with_calibration(server, tmp_path, **overrides):
    path = tmp_path / "calibration.json"
    path.write_text(Calibration(kind="platt", params={"a": 20.0, "b": -16.0}, base_rate=0.5, prior=0.8).to_json())
    return openai_settings(server, method="ragas_judge_intent", calibration=str(path), **overrides)


def test_labels_do_not_move_with_the_prior_but_the_score_and_version_do(server, tmp_path):
    question, answer = "Where is France and what is its capital?", "France is in western Europe and Paris is its capital."
    results = {prior: Engine(_settings_with_calibration(server, tmp_path, relevancy_prior=prior)).score(question, answer) for prior in (0.05, 0.5, 0.95)}
    assert all(r.status == "scored" for r in results.values())
    assert len({r.label for r in results.values()}) == 1
    assert len({r.evidence for r in results.values()}) == 1
    assert results[0.05].score < results[0.5].score < results[0.95].score
    assert [r.prior for r in results.values()] == [0.05, 0.5, 0.95]
    assert len({r.evaluator_version for r in results.values()}) == 3
    # unset: the calibration's stated prior
    assert Engine(_settings_with_calibration(server, tmp_path)).score(question, answer).prior == 0.8


def test_an_echo_stays_does_not_address_under_any_prior():
    calibration = load_calibration(str(SHIPPED))
    echo = {"novelty": 0.0, "answer_similarity": 1.0, "refusal_sources": 0.05, "refusal_evasion": 0.05}
    for prior in (0.01, 0.5, 0.99):
        # even a raw score whose evidence reaches partially_addresses: the kind decides
        score, evidence, _, label, explanation, kind = interpret(0.75, calibration, EVIDENCE_THRESHOLDS, True, prior, echo, [1.0, 1.0, 1.0], [False] * 3)
        assert (label, kind) == ("does_not_address", "echo") and "restates the question" in explanation
    score, _, _, label, _, kind = interpret(0.95, calibration, EVIDENCE_THRESHOLDS, True, 0.01, echo, [], [])
    assert label == "directly_addresses" and kind is None and score < 0.5  # a strong answer under a tiny prior


@pytest.mark.parametrize(
    "components,sims,flags,kind",
    [
        ({"novelty": 0.05, "answer_similarity": 0.98}, [0.9], [False], "echo"),
        ({"novelty": 0.9, "answer_similarity": 0.1, "refusal_sources": 0.45, "refusal_evasion": 0.28}, [0.1], [True], "hedge"),
        ({"novelty": 0.45, "answer_similarity": 0.8, "refusal_sources": 0.3, "refusal_evasion": 0.1}, [0.8], [False], "hedge"),
        ({"novelty": 0.95, "answer_similarity": 0.02, "refusal_sources": 0.3, "refusal_evasion": 0.4}, [0.1], [True], "evasive"),
        ({"novelty": 0.99, "answer_similarity": 0.1, "refusal_sources": 0.05, "refusal_evasion": 0.05}, [0.2, 0.3], [False, False], "off_topic"),
        ({"novelty": 0.9, "answer_similarity": 0.25, "refusal_sources": 0.05, "refusal_evasion": 0.05}, [0.7, 0.1], [False, False], "padded"),
        ({"novelty": 0.8, "answer_similarity": 0.55, "refusal_sources": 0.05, "refusal_evasion": 0.05}, [0.7], [False], "incomplete"),
        ({"judge": 0.4}, [], [], "other"),
    ],
)
def test_failure_kind_rules(components, sims, flags, kind):
    assert failure.failure_kind(components, sims, flags) == kind


@hsettings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["novelty", "answer_similarity", "refusal_sources", "refusal_evasion", "judge"]), st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=3))),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=5),
    st.lists(st.booleans(), max_size=5),
)
def test_failure_kind_never_raises_and_names_a_kind(components, sims, flags):
    assert failure.failure_kind(components, sims, flags) in failure.FAILURE_KINDS


@pytest.fixture(scope="module")
def dev_rows():
    if not (SHARED / "data" / "relevancy_pairs_en.jsonl").exists():
        pytest.fail(f"the development sets are missing at {SHARED / 'data'}")
    from benchmarks.production_mix import RESULTS, scored_rows

    return scored_rows(RESULTS / "quality_records.jsonl.gz", SHIPPED, None)


def _share(rows, test):
    return sum(1 for r in rows if test(r)) / len(rows)


def test_on_the_dev_sets_at_the_prior_the_score_is_calibrated_and_the_labels_hold(dev_rows):
    """Issue 33's targets on the rows the calibration was not fitted on (pairs and WikiEval,
    reference answers at the prior's share)."""
    held = [r for r in dev_rows if r["held_out"] and r["set"] != "human"]
    p = np.asarray([r["score"] for r in held])
    y = np.asarray([r["relevant"] for r in held])
    assert expected_calibration_error(p, y, weights=prior_weights(y, 0.8)) <= 0.05
    assert _share([r for r in held if r["kind"] == "reference"], lambda r: r["label"] == "directly_addresses") >= 0.9
    for kind in ("echo", "hedge", "evasive", "off_topic"):
        assert _share([r for r in held if r["kind"] == kind], lambda r: r["label"] in ("somewhat_related", "does_not_address")) >= 0.9, kind


def test_on_the_dev_sets_the_failure_kind_is_right_for_most_echoes_hedges_and_off_topic_answers(dev_rows):
    held = [r for r in dev_rows if r["held_out"] and r["failure_kind"] is not None]
    for kind, floor in (("echo", 0.9), ("hedge", 0.9), ("off_topic", 0.75), ("evasive", 0.5)):
        rows = [r for r in held if r["kind"] == kind]
        assert _share(rows, lambda r: r["failure_kind"] == kind) >= floor, kind


def test_the_failure_kind_goes_on_the_span_and_the_evaluations_counter():
    from relevancy_tracer.otel import attributes as A
    from relevancy_tracer.otel.metrics import RelevancyMetrics
    from relevancy_tracer.otel.results import outcome_attributes, record_outcome
    from relevancy_tracer.result import RelevancyResult

    result = RelevancyResult(score=0.01, label="does_not_address", explanation="x", status="scored", method="ragas_judge_intent", evidence=-6.0, prior=0.8, failure_kind="hedge", calibrated=True, raw_score=0.5)
    attrs = outcome_attributes("scored", result, capture_content=False, limit=100)
    assert (attrs[A.FAILURE_KIND], attrs[A.EVIDENCE], attrs[A.PRIOR]) == ("hedge", -6.0, 0.8)
    metrics = RelevancyMetrics("svc", lambda: 0)
    record_outcome(metrics, "answer", attrs, result)
    assert [key[-1] for key in metrics.counts()] == ["hedge"]
    observed = list(metrics._observe_counts(None))
    assert observed[0].attributes[A.FAILURE_KIND] == "hedge" and observed[0].attributes[A.LABEL] == "does_not_address"
