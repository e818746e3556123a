"""The answer-relevancy engine: input checks, the chosen method, labels, usage and timing.

``Engine.ascore`` never raises for bad data or model failures: every problem becomes a
:class:`~relevancy_tracer.result.RelevancyResult` with a named status. Only programming errors
in the call itself (an unknown setting name, a setting value out of range) raise.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, Optional, TypeVar

from .._background import fork as _fork
from .._logging import log_failure
from .._background.loop import process_loop
from ..config import MODEL_FIELDS, Settings
from .backends import build_models
from ..models.base import Models
from ..result import EvaluationError, RelevancyResult, Status, Usage, label_for
from .calibration import Calibration
from . import conversation, failure, prompts
from .evaluator import evaluator_version, identity_key, labels_on_evidence, raw_fingerprint, resolve_calibration, thresholds_for
from .methods import METHODS, EvalContext, StepCache, failure_of
from .parsing import ReplyError, ask_json

logger = logging.getLogger("relevancy_tracer")

T = TypeVar("T")

atexit.register(lambda: process_loop().stop(5.0))  # closes HTTP sessions bound to it before exit


def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code (also from inside a running event loop).

    The coroutine runs on the process's one long-lived background loop (``_loop.process_loop``),
    so HTTP clients keep their connection pools between calls.
    """
    return process_loop().run(factory)


def prepare_inputs(question: Any, answer: Any, contexts: Any, settings: Settings) -> tuple[str, str, Optional[list[str]], bool]:
    """Check and normalise inputs: (question, answer, contexts, truncated).

    Question and answer must be non-empty ``str`` (bytes, dicts, numbers and None are rejected
    with status ``invalid_input``; decoding bytes would be a guess). Texts longer than the
    budgets are cut. Contexts are recorded only, so anything usable is kept: a str becomes a
    one-item list and non-str items are converted with ``str``.
    """
    for name, value in (("question", question), ("answer", answer)):
        if value is None:
            raise EvaluationError(Status.INVALID_INPUT, f"{name} is None")
        if not isinstance(value, str):
            raise EvaluationError(Status.INVALID_INPUT, f"{name} must be str, not {type(value).__name__}")
        if not value.strip():
            raise EvaluationError(Status.INVALID_INPUT, f"{name} is empty")
    question, answer = question.strip(), answer.strip()
    truncated = False
    if len(question) > settings.max_question_chars:
        question, truncated = question[: settings.max_question_chars], True
    if len(answer) > settings.max_answer_chars:
        answer, truncated = answer[: settings.max_answer_chars], True
    context_list: Optional[list[str]] = None
    if contexts is not None:
        items = [contexts] if isinstance(contexts, str) else contexts
        try:
            context_list = [item if isinstance(item, str) else str(item) for item in items]
        except TypeError:
            context_list = [str(contexts)]
    return question, answer, context_list, truncated


def interpret(
    raw: float,
    calibration: Optional[Calibration],
    thresholds: tuple[float, ...],
    on_evidence: bool,
    prior: Optional[float],
    components: dict[str, float],
    similarities: list[float],
    noncommittal: list[bool],
) -> tuple[float, Optional[float], Optional[float], str, str, Optional[str]]:
    """What a raw score says: ``(score, evidence, prior, label, explanation, failure_kind)``.

    ``score``: the calibrated probability under ``prior`` (the calibration's stated prior when
    None), else ``raw``, clipped to [0, 1]. ``evidence``: the calibration's log likelihood ratio
    (None uncalibrated). The label is read from the evidence when ``on_evidence`` (so it does
    not move with the prior), else from the score; an answer below ``directly_addresses`` gets
    its :func:`~.failure.failure_kind` (named in the explanation unless ``other``), and one of
    the kinds that do not address the question (:data:`~.failure.NOT_ADDRESSING`) is labelled
    ``does_not_address`` when on evidence.
    """
    evidence = used_prior = None
    if calibration is not None:
        used_prior = calibration.effective_prior(prior)
        evidence = float(calibration.evidence(raw))
        score = min(1.0, max(0.0, float(calibration(raw, prior))))
    else:
        # an uncalibrated cosine mean can be negative; OpenTelemetry histograms reject negative
        # amounts, so the reported score is clipped (raw keeps its sign)
        score = min(1.0, max(0.0, raw))
    label, explanation = label_for(evidence if on_evidence and evidence is not None else score, thresholds)
    kind = None
    if label != "directly_addresses":
        kind = failure.failure_kind(components, similarities, noncommittal)
        if on_evidence and kind in failure.NOT_ADDRESSING:
            label, explanation = label_for(float("-inf"), thresholds)
        if kind != "other":
            explanation = f"{explanation}: {failure.EXPLANATIONS[kind]}"
    return score, evidence, used_prior, label, explanation, kind


def read_history_or_none(history: Any, settings: Settings) -> tuple["conversation.History", Optional[str]]:
    """(the bounded history, its status): ``read`` with turns, ``invalid`` for a value of no
    known shape (then an empty history: the call is judged as single-turn), None without one."""
    try:
        past = conversation.read_history(history, settings.max_history_turns, settings.max_history_chars)
    except (conversation.HistoryError, RecursionError):
        return conversation.History(), conversation.HISTORY_INVALID
    return past, ("read" if past else None)


def conversation_version(version: str, settings: Settings) -> str:
    """The evaluator version of an evaluation that read a conversation: ``version`` (the
    single-turn evaluator's) with :func:`~.conversation.fingerprint` folded in, so single-turn
    scores stay comparable across this change and conversation ones carry their own."""
    import hashlib
    import json

    payload = json.dumps({"version": version, "conversation": conversation.fingerprint(settings.max_history_turns, settings.max_history_chars)}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]


def _renew_engine_lock(engine: "Engine") -> None:
    engine._override_lock = threading.Lock()


class Engine:
    """Scores answer relevancy with one set of settings and model backends.

    Args:
        settings: resolved settings (default: ``Settings.resolve()``, i.e. environment).
        models: backends to use instead of building them from ``settings`` (tests, custom models).

    Backends are built lazily on first use. Per-call overrides of metric settings (strictness,
    method, noncommittal, generation, thresholds, ...) are cheap; overriding a model setting
    builds backends for that call (local models are still loaded only once per process).
    """

    def __init__(self, settings: Optional[Settings] = None, *, models: Optional[Models] = None):
        self.settings = settings or Settings.resolve()
        self._models = models
        self._cache = StepCache()
        self._override_models: dict[tuple, Models] = {}
        self._override_lock = threading.Lock()
        _fork.renew_after_fork(self, _renew_engine_lock)
        self._identities: dict[tuple, tuple[Optional[Calibration], tuple[float, float, float], str]] = {}

    def raw_fingerprint(self, settings: Optional[Settings] = None, models: Optional[Models] = None) -> str:
        """The fingerprint of the raw-score producer for ``settings`` (default: the engine's);
        a calibration fitted on this engine's raw scores records it."""
        settings = settings or self.settings
        models = models or self._models_for(settings)
        embedder = models.embedder
        return raw_fingerprint(settings, models.llm.name, embedder.name if embedder is not None else None, getattr(models.llm, "decoding", ""))

    def identity(self, settings: Settings, models: Optional[Models] = None) -> tuple[Optional[Calibration], tuple[float, float, float], str]:
        """(calibration or None, label thresholds, evaluator version) for ``settings``.

        Computed once per distinct evaluator (see :mod:`relevancy_tracer.scoring.evaluator`).
        """
        llm_name = models.llm.name if models is not None else settings.resolved_llm_model
        embedder = models.embedder if models is not None else None
        embedding_name = embedder.name if embedder is not None else settings.resolved_embedding_model
        decoding = getattr(models.llm, "decoding", "") if models is not None else ""
        key = identity_key(settings, llm_name, embedding_name, decoding)
        found = self._identities.get(key)
        if found is None:
            raw = raw_fingerprint(settings, llm_name, embedding_name, decoding)
            calibration = resolve_calibration(settings.calibration, raw, settings.method)
            thresholds = thresholds_for(settings, calibration is not None)
            prior = calibration.effective_prior(settings.relevancy_prior) if calibration is not None else None
            found = (calibration, thresholds, evaluator_version(raw, calibration, thresholds, prior))
            if len(self._identities) > 256:
                self._identities.clear()
            self._identities[key] = found
        return found

    @property
    def models(self) -> Models:
        """The backends (built on first access)."""
        if self._models is None:
            self._models = build_models(self.settings)
        return self._models

    def _models_for(self, settings: Settings) -> Models:
        """Backends for ``settings``: the engine's own, or ones built for per-call model
        overrides, kept in a small LRU so their HTTP clients are reused (and closed with
        their loop) instead of being rebuilt and dropped on every call."""
        key = tuple(getattr(settings, f) for f in MODEL_FIELDS)
        if key == tuple(getattr(self.settings, f) for f in MODEL_FIELDS):
            return self.models
        with self._override_lock:
            models = self._override_models.pop(key, None)
            if models is None:
                models = build_models(settings)
            self._override_models[key] = models  # most recent last
            while len(self._override_models) > 8:
                self._override_models.pop(next(iter(self._override_models)))
            return models

    def settings_for(self, overrides: dict[str, Any]) -> Settings:
        """Settings with per-call ``overrides`` (raises TypeError/ValueError on bad ones)."""
        return self.settings.replace(**overrides) if overrides else self.settings

    async def ascore(
        self,
        question: Any,
        answer: Any,
        contexts: Any = None,
        *,
        history: Any = None,
        timeout: Optional[float] = None,
        **overrides: Any,
    ) -> RelevancyResult:
        """Score one (question, answer); never raises for bad data or model failures.

        Args:
            question, answer: the user's question (its last turn in a conversation) and the
                app's answer (non-empty str).
            contexts: retrieved passages (list[str]); recorded, not used by the score.
            history: the conversation's earlier turns, oldest first (a list of
                ``{"role", "content"}`` messages, LangChain or LlamaIndex messages; see
                :func:`~.conversation.read_history`), or None. With turns, the question is
                first rewritten as a standalone question from them (one more chat request,
                cached per conversation and question), the answer is judged against it, and an
                answer that repeats an earlier assistant turn gets no topical credit. A value
                of another shape is ignored: the call is judged as single-turn, with
                ``history_status`` ``invalid``. Bounded by ``max_history_turns`` and
                ``max_history_chars``.
            timeout: seconds for the whole evaluation (status ``timeout`` when exceeded).
            **overrides: per-call settings (``strictness=5``, ``method="direct"``, ...).

        Returns:
            A :class:`RelevancyResult` with ``status == "scored"`` and a finite score, or a
            named failure status, message and no score.

        Raises:
            TypeError, ValueError: an unknown override name or an out-of-range override value.
        """
        settings = self.settings_for(overrides)
        started = time.perf_counter()
        usage = Usage()
        models: Optional[Models] = None
        q = a = None
        ctxs: Optional[list[str]] = None
        truncated = False
        past, history_status = read_history_or_none(history, settings)
        standalone: Optional[str] = None
        try:
            q, a, ctxs, truncated = prepare_inputs(question, answer, contexts, settings)
            models = self._models_for(settings)

            async def evaluate() -> Any:
                nonlocal standalone
                judged = q
                if past:
                    judged = standalone = await self._standalone(past, q, settings, models, usage)
                context = EvalContext(question=judged, answer=a, settings=settings, models=models, usage=usage, cache=self._cache, history=past.turns)
                return await METHODS[settings.method].score(context)

            output = await (asyncio.wait_for(evaluate(), timeout) if timeout is not None else evaluate())
            raw = float(output.score)
            calibration, thresholds, version = self.identity(settings, models)
            if past:
                version = conversation_version(version, settings)
            on_evidence = labels_on_evidence(settings, calibration is not None)
            reported, evidence, prior, label, explanation, kind = interpret(raw, calibration, thresholds, on_evidence, settings.relevancy_prior, output.components, output.similarities, output.noncommittal)
            details = output.details()  # the method's details, carried as they are
            details["components"] = output.components or {settings.method: raw}
            result = RelevancyResult(
                score=reported,
                raw_score=raw,
                calibrated=calibration is not None,
                evaluator_version=version,
                label=label,
                explanation=explanation,
                evidence=evidence,
                prior=prior,
                failure_kind=kind,
                status=Status.SCORED,
                method=settings.method,
                **details,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes a result; nothing escapes to the caller
            status, message = failure_of(exc)
            if status == Status.INTERNAL_ERROR:
                log_failure("internal error while scoring", settings.capture_content, exc)
            result = RelevancyResult.failure(status, message, method=settings.method)
            try:
                version = self.identity(settings, models)[2]
                result.evaluator_version = conversation_version(version, settings) if past else version
            except Exception:  # identity of a failed evaluation is best effort
                logger.debug("relevancy-tracer: no evaluator version for a failed evaluation", exc_info=True)
        result.strictness = settings.strictness
        result.llm_model = models.llm.name if models else settings.resolved_llm_model
        result.embedding_model = (models.embedder.name if models and models.embedder else settings.resolved_embedding_model)
        result.input_tokens = usage.input_tokens
        result.output_tokens = usage.output_tokens
        result.llm_calls = usage.llm_calls
        result.latency_ms = (time.perf_counter() - started) * 1000.0
        result.truncated = truncated
        result.question, result.answer, result.contexts = q, a, ctxs
        result.standalone_question = standalone
        result.history_turns = len(past.turns)
        result.history_status = history_status
        result.truncated = result.truncated or past.truncated
        return result

    async def _standalone(self, past: "conversation.History", question: str, settings: Settings, models: Models, usage: Usage) -> str:
        """The last turn ``question`` rewritten as a standalone question from ``past``
        (:func:`~.prompts.standalone_question`): one chat request, cached per (model,
        conversation, question), so the answers of one turn share it. Raises ModelError /
        EvaluationError as any model step."""
        def validate(data: Any) -> str:
            text = data.get("question") if isinstance(data, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ReplyError('expected {"question": "..."}')
            return text.strip()[: settings.max_question_chars]

        async def rewrite() -> str:
            value, _ = await ask_json(
                models.llm,
                prompts.standalone_question(past.turns, question),
                prompts.STANDALONE_SCHEMA,
                validate,
                usage=usage,
                retries=settings.json_retries,
                max_tokens=96,
            )
            return value

        key = ("standalone", models.llm.name, past.key(), question)
        value = self._cache.get(key)
        if value is None:
            value = await asyncio.shield(self._cache.shared(key, rewrite))
            self._cache.put(key, value)
        return value

    def score(self, question: Any, answer: Any, contexts: Any = None, *, history: Any = None, **overrides: Any) -> RelevancyResult:
        """Blocking :meth:`ascore` (works inside a running event loop too)."""
        return run_sync(lambda: self.ascore(question, answer, contexts, history=history, **overrides))

    async def aevaluate(
        self,
        rows: Iterable[Any],
        *,
        concurrency: Optional[int] = None,
        on_result: Optional[Callable[[int, RelevancyResult], None]] = None,
        mapping: Any = None,
        **overrides: Any,
    ) -> list[RelevancyResult]:
        """Score many rows concurrently, at most ``concurrency`` at once; results in row order.

        ``rows``: dicts (or a pandas DataFrame) with question/answer/contexts columns (and an
        optional ``history`` column of earlier turns, see :meth:`ascore`), or the
        RAGAS names user_input/response/retrieved_contexts; ``mapping`` (a
        :class:`~relevancy_tracer.dataset.ColumnMapping`) picks other columns or dotted paths.
        A row that cannot be read gets status ``invalid_input``. ``on_result(index, result)`` is
        called as each row finishes.
        """
        from ..dataset.columns import ColumnMapping, iter_rows

        settings = self.settings_for(overrides)
        mapping = mapping or ColumnMapping()
        limit = asyncio.Semaphore(concurrency or settings.concurrency)
        items = list(iter_rows(rows))

        async def one(index: int, row: Any) -> RelevancyResult:
            async with limit:
                try:
                    question, answer, contexts = mapping.extract(row)
                    history = mapping.extract_history(row)
                except Exception as exc:
                    result = RelevancyResult.failure(Status.INVALID_INPUT, f"row {index}: {exc}", method=settings.method)
                else:
                    result = await self.ascore(question, answer, contexts, history=history, **overrides)
            if on_result is not None:
                on_result(index, result)
            return result

        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(items))))

    def evaluate(
        self,
        rows: Iterable[Any],
        *,
        concurrency: Optional[int] = None,
        as_dataframe: bool = False,
        mapping: Any = None,
        **overrides: Any,
    ) -> Any:
        """Blocking :meth:`aevaluate`. With ``as_dataframe=True`` returns a pandas DataFrame
        (one row per input, columns of :meth:`RelevancyResult.to_dict`); needs pandas."""
        results = run_sync(lambda: self.aevaluate(rows, concurrency=concurrency, mapping=mapping, **overrides))
        if not as_dataframe:
            return results
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("as_dataframe=True needs pandas: pip install 'relevancy-tracer[pandas]'") from exc
        return pd.DataFrame([r.to_dict(include_inputs=True) for r in results])
