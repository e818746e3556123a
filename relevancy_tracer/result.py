"""The answer-relevancy result and its status names."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional, Sequence


class Status:
    """Status names of one evaluation (``RelevancyResult.status``, span ``relevancy.status``).

    Engine statuses: ``scored`` and the named failures below. The tracer adds ``not_sampled``,
    ``dropped``, ``capacity`` (not scored: the scorer could not finish it in time, shed at
    once), ``deferred`` (on an answer span whose hold ended while its evaluation ran: the result
    goes on the EVALUATOR span linked to it), ``timeout``, ``shutdown``, ``skipped`` (the app
    raised or returned nothing the tracer may read), ``incomplete`` (a stream closed early) and
    ``cancelled``;
    on spans every engine failure appears as ``error`` with its name in ``relevancy.error.type``.
    """

    SCORED = "scored"
    # engine failures
    INVALID_INPUT = "invalid_input"  # empty / non-str question or answer
    INVALID_JSON = "invalid_json"  # the LLM reply was not the JSON asked for, after re-asking
    TOO_FEW_QUESTIONS = "too_few_questions"  # no usable generated question
    UNREADABLE_SCORE = "unreadable_score"  # a judge reply held no number in range
    EMBEDDING_ERROR = "embedding_error"  # wrong vector count, zero or NaN vectors
    MODEL_ERROR = "model_error"  # HTTP / connection / backend failure after retries
    MODEL_HOST_CRASHED = "model_host_crashed"  # the local model host died in flight or cannot restart
    TIMEOUT = "timeout"
    INTERNAL_ERROR = "internal_error"  # a bug in the engine; never raised to the caller
    # tracer statuses
    NOT_SAMPLED = "not_sampled"
    DROPPED = "dropped"
    CAPACITY = "capacity"  # shed by admission control: the scorer could not finish it before its deadline
    DEFERRED = "deferred"  # answer span only: the hold ended; the result goes on a linked EVALUATOR span
    ERROR = "error"
    SHUTDOWN = "shutdown"
    SKIPPED = "skipped"
    INCOMPLETE = "incomplete"  # a stream closed before its end (not scored by default)
    CANCELLED = "cancelled"  # the call was cancelled (CancelledError, GeneratorExit): not an error


#: The four labels and their explanations (the bands of the multi-method article "Answer
#: Relevancy in RAG"), from the highest band to the lowest.
LABELS = (
    ("directly_addresses", "Answer directly addresses the question"),
    ("partially_addresses", "Answer partially addresses the question"),
    ("somewhat_related", "Answer is somewhat related but misses key aspects"),
    ("does_not_address", "Answer does not address the question"),
)


def label_for(score: float, thresholds: Sequence[float]) -> tuple[str, str]:
    """(label, explanation) of ``score`` for descending ``thresholds``.

    With the default thresholds (0.8, 0.6, 0.4): >= 0.8 ``directly_addresses``, >= 0.6
    ``partially_addresses``, >= 0.4 ``somewhat_related``, else ``does_not_address``.
    """
    for (label, explanation), threshold in zip(LABELS, thresholds):
        if score >= threshold:
            return label, explanation
    return LABELS[-1]


class EvaluationError(Exception):
    """A named evaluation failure inside the engine; turned into a result, never raised out."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Usage:
    """Model usage of one evaluation: tokens and request counts."""

    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    embedding_calls: int = 0

    def add(self, input_tokens: int = 0, output_tokens: int = 0, llm_calls: int = 0, embedding_calls: int = 0) -> None:
        self.input_tokens += int(input_tokens or 0)
        self.output_tokens += int(output_tokens or 0)
        self.llm_calls += llm_calls
        self.embedding_calls += embedding_calls


@dataclass(kw_only=True)
class MethodDetails:
    """What a relevancy method found besides its score: the fields a method fills in
    (:class:`~relevancy_tracer.scoring.methods.MethodOutput`) and the result carries unchanged
    (:class:`RelevancyResult`). Each is declared here only.

    Attributes:
        generated_questions: the N questions reverse-generated from the answer (may be empty
            for methods that do not generate them).
        similarities: cosine similarity (or LLM-rated similarity for ``llm_similarity``) of each
            generated question to the original, in generation order.
        noncommittal: one flag per generated question, True for an evasive or vague answer.
        components: score of each component method (``combined`` and composite defaults).
        failed_components: component name -> failure status, for components that failed.
        sub_questions, sub_questions_addressed: the ``decomposition`` method's details.
        intent: the ``intent`` method's statement of the question's intent.
    """

    generated_questions: list[str] = field(default_factory=list)
    similarities: list[float] = field(default_factory=list)
    noncommittal: list[bool] = field(default_factory=list)
    components: dict[str, float] = field(default_factory=dict)
    failed_components: dict[str, str] = field(default_factory=dict)
    sub_questions: list[str] = field(default_factory=list)
    sub_questions_addressed: list[bool] = field(default_factory=list)
    intent: Optional[str] = None

    def details(self) -> dict[str, Any]:
        """The :class:`MethodDetails` fields of this object by name (the values themselves, not
        copies): what a :class:`RelevancyResult` is built with from a method's output."""
        return {f.name: getattr(self, f.name) for f in fields(MethodDetails)}


@dataclass
class RelevancyResult(MethodDetails):
    """The answer-relevancy result of one (question, answer) pair: the method's details
    (:class:`MethodDetails`, keyword-only) and what the engine adds.

    Attributes:
        score: float in [0, 1], finite, when ``status == "scored"``. With a calibration
            (``calibrated`` True, the default for the embedded models) it is the estimated
            probability that a person would judge the answer as addressing the question; without
            one it is ``raw_score``. ``None`` for any other status: a failed evaluation has no
            score, so it can never be averaged in by mistake. Never NaN.
        raw_score: the method's own output before calibration (a mean cosine similarity for
            ``ragas``, in [-1, 1] in theory, as RAGAS notes; an expected judge rating in [0, 1];
            a weighted mean of components). ``None`` when not scored.
        calibrated: True when ``score`` is a calibrated probability.
        evaluator_version: 12 hex digits identifying the evaluator (method, prompts, models,
            weights, calibration, thresholds); scores are comparable only within one version.
        label, explanation: one of the four labels ``directly_addresses``,
            ``partially_addresses``, ``somewhat_related``, ``does_not_address`` and its sentence;
            ``None`` when not scored. With a calibration they come from the evidence (the log
            likelihood ratio, prior-free), otherwise from ``score`` and the thresholds.
        evidence: the calibrated score's natural-log likelihood ratio ``log P(raw | relevant) /
            P(raw | not relevant)`` (no prior in it); ``None`` when uncalibrated or not scored.
        prior: the prior the calibrated ``score`` assumes (the share of relevant answers in
            the traffic, ``relevancy_prior``), in (0, 1); ``None`` when uncalibrated.
        failure_kind: why an answer labelled below ``directly_addresses`` failed: ``echo``,
            ``hedge``, ``evasive``, ``off_topic``, ``padded``, ``incomplete`` or ``other``
            (:mod:`relevancy_tracer.scoring.failure`); ``None`` for a directly addressing or
            unscored answer.
        method: the method that produced the score (``ragas``, ``direct``, ... ``combined``).
        status: ``scored`` or a named failure (:class:`Status`); ``error``: its message.
        generated_questions, similarities, noncommittal, components, failed_components,
            sub_questions, sub_questions_addressed, intent: see :class:`MethodDetails`.
        strictness: N. llm_model / embedding_model: model names used.
        input_tokens, output_tokens: LLM tokens of this evaluation; llm_calls: chat requests.
        latency_ms: wall-clock duration of the evaluation, in milliseconds.
        truncated: True when the answer, question or history was cut to the configured budget.
        standalone_question: with a conversation, the last turn rewritten as a standalone
            question, which the answer was judged against; None without one.
        history_turns: the earlier turns of the conversation read (0 without one).
        history_status: ``read`` when earlier turns were read, ``invalid`` when a history of no
            known shape was given (the call was judged as single-turn), None without one.
        question, answer, contexts: the inputs as scored (after truncation); contexts are
            recorded, not used by the score.
    """

    score: Optional[float]
    label: Optional[str]
    explanation: Optional[str]
    status: str
    method: str
    error: Optional[str] = None
    raw_score: Optional[float] = None
    calibrated: bool = False
    evaluator_version: Optional[str] = None
    evidence: Optional[float] = None
    prior: Optional[float] = None
    failure_kind: Optional[str] = None
    strictness: int = 0
    llm_model: Optional[str] = None
    embedding_model: Optional[str] = None
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0
    latency_ms: float = 0.0
    truncated: bool = False
    standalone_question: Optional[str] = None
    history_turns: int = 0
    history_status: Optional[str] = None
    question: Optional[str] = None
    answer: Optional[str] = None
    contexts: Optional[list[str]] = None

    def __post_init__(self) -> None:
        if (self.score is not None and not math.isfinite(self.score)) or (self.raw_score is not None and not math.isfinite(self.raw_score)):
            # A NaN/inf score is an engine bug; never let it escape.
            self.error = f"non-finite score {self.score!r} (raw {self.raw_score!r})"
            self.score = self.raw_score = None
            self.label = self.explanation = self.failure_kind = None
            self.evidence = None
            self.status = Status.INTERNAL_ERROR

    @property
    def ok(self) -> bool:
        """True when the evaluation produced a score."""
        return self.status == Status.SCORED

    def to_dict(self, include_inputs: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict; inputs (question/answer/contexts) only on request. Keys in
        order: the result's own fields, then the method's details, then the inputs."""
        data = asdict(self)
        inputs = ("question", "answer", "contexts")
        details = self.details()
        ordered = {k: v for k, v in data.items() if k not in details and k not in inputs}
        ordered.update((k, data[k]) for k in details)
        if include_inputs:
            ordered.update((k, data[k]) for k in inputs)
        return ordered

    def without_content(self) -> "RelevancyResult":
        """A copy with every text taken from, or generated about, the user's question and answer
        removed (inputs, the standalone question, generated questions, sub-questions, intent,
        error message): what hooks
        receive when content capture is off."""
        import dataclasses

        return dataclasses.replace(
            self,
            question=None,
            answer=None,
            contexts=None,
            standalone_question=None,
            generated_questions=[],
            sub_questions=[],
            intent=None,
            error=None,
        )

    @classmethod
    def failure(cls, status: str, error: str, *, method: str, strictness: int = 0, **extra: Any) -> "RelevancyResult":
        """A result for a failed evaluation: no score, a named status and its message."""
        return cls(score=None, label=None, explanation=None, status=status, method=method, error=error, strictness=strictness, **extra)
