"""The relevancy methods: RAGAS answer relevancy (Es et al. 2023), the alternatives of the
multi-method article "Answer Relevancy in RAG: Does the Response Address the Question?", and
their combinations.

Each method is one :class:`Method` entry in :data:`METHODS` (its run, components, fingerprint
prompts and calibration files). Scoring raises :class:`~relevancy_tracer.result.EvaluationError`
(a named failure) or :class:`~relevancy_tracer.models.base.ModelError`; the engine turns both
into results.

=================  ======================================================  ================
method             score                                                   LLM calls
=================  ======================================================  ================
``ragas``          mean cosine(E(generated_i), E(question)) under the      1 (joint) or N
                   noncommittal rule (RAGAS)                               + 1 embeddings
``llm_similarity`` mean LLM-rated similarity of generated_i to the          2 (joint)
                   question on the article's 0/0.25/0.5/0.75/1 scale
``direct``         LLM rating 1-5 (expected value) of how well the answer  1
                   addresses the question (the article)
``decomposition``  share of the question's sub-questions the answer        1 (+1 per new
                   addresses (the article)                                 question, cached)
``intent``         LLM rating 1-5 (expected value) of how well the answer  1 (+1 per new
                   fulfils the question's stated intent (the article)      question, cached)
``combined``       weighted mean of components, weights renormalised over  sum of components
                   the ones that succeeded (the article's 0.3/.25/.25/.2)
``ragas_intent``   0.2 ragas + 0.8 intent (the default before 0.3; see     2 (+1 per new
                   ``RAGAS_INTENT_WEIGHTS``)                               question, cached)
``ragas_judge``    a 1-5 judgement asked as the second turn of the RAGAS   2 (one KV-shared
                   question conversation, plus the answer's capped         conversation)
                   topicality, up to what the answer adds beyond the       + 1 embeddings
                   question (no credit for restating it); the previous
                   default
``ragas_judge_``   the default: ``ragas_judge``'s judgement and the        3 (+1 per new
``intent``         ``intent`` judgement (0.25 / 0.75), plus the capped     question, cached)
                   topicality, none for an answer that restates the        + 1 embeddings
                   question (see ``RAGAS_JUDGE_INTENT``)
=================  ======================================================  ================

Question-only steps (decomposition into sub-questions, the intent statement) depend on the
question alone, so they are cached per (model, question): production traffic repeats questions.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

import numpy as np

from .. import config
from .._background import fork as _fork
from ..config import Settings
from ..models.base import ModelError, Models
from ..result import EvaluationError, MethodDetails, Status, Usage
from . import conversation, failure, prompts, restatement
from .parsing import CutJSON, ReplyError, ask_json, judged_score, read_flag, read_number

QUESTION_TOKENS = 48  # max output tokens budgeted per generated question (plus JSON overhead)


@dataclass
class MethodOutput(MethodDetails):
    """What a method computed: its raw ``score`` and its details (:class:`MethodDetails`,
    keyword-only); the engine builds the :class:`~relevancy_tracer.result.RelevancyResult`
    from them and adds calibration, label, usage and timing."""

    score: float


class StepCache:
    """A bounded LRU of question-only step results, keyed by (step, model, question), and the
    steps in flight: evaluations of one question running at once on one event loop share one
    request (:meth:`EvalContext.cached`)."""

    def __init__(self, maxsize: int = 2048):
        self._data: "OrderedDict[tuple, Any]" = OrderedDict()
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._inflight: dict[tuple, "asyncio.Future[Any]"] = {}
        _fork.renew_after_fork(self, StepCache._renew_after_fork)

    def _renew_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._inflight = {}

    def shared(self, key: tuple, factory: Callable[[], Awaitable[Any]]) -> "asyncio.Future[Any]":
        """The task computing ``key`` on the running loop: the one in flight, or a new one from
        ``factory()`` (forgotten once done; at most one per key, so bounded by the evaluations
        in flight)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            task = self._inflight.get(key)
            if task is None or task.done() or task.get_loop() is not loop:
                task = self._inflight[key] = loop.create_task(factory())

                def forget(done: "asyncio.Future[Any]") -> None:
                    if not done.cancelled():
                        done.exception()  # retrieved: every waiter may have been cancelled
                    with self._lock:
                        if self._inflight.get(key) is done:
                            del self._inflight[key]

                task.add_done_callback(forget)
        return task

    def get(self, key: tuple) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key: tuple, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._maxsize:
                self._data.popitem(last=False)


@dataclass
class EvalContext:
    """One evaluation's inputs, settings, backends, usage counter and per-evaluation memo."""

    question: str
    answer: str
    settings: Settings
    models: Models
    usage: Usage
    cache: StepCache
    #: the conversation's earlier turns (:class:`~.conversation.Turn`), when the call came with
    #: them; ``question`` is then the last turn rewritten as a standalone question
    history: tuple = ()
    _memo: dict = field(default_factory=dict)

    def once(self, key: str, factory: Callable[[], Awaitable[Any]]) -> "asyncio.Future[Any]":
        """Run ``factory()`` once per evaluation (e.g. question generation shared by two methods)."""
        task = self._memo.get(key)
        if task is None:
            task = self._memo[key] = asyncio.ensure_future(factory())
        return task

    async def ask(self, messages: list, schema: dict, validate: Callable[[Any], Any], *, max_tokens: int, temperature: float = 0.0, seed: Optional[int] = None) -> Any:
        """The validated JSON reply to ``messages`` (re-asked when malformed)."""
        value, _ = await ask_json(
            self.models.llm,
            messages,
            schema,
            validate,
            usage=self.usage,
            retries=self.settings.json_retries,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
        )
        return value

    async def ask_score(self, messages: list) -> float:
        """A judge's 1-5 ``{"score": n}`` reply as a [0, 1] score (expected value when the
        backend reports digit probabilities)."""
        value, reply = await ask_json(
            self.models.llm,
            messages,
            prompts.SCORE_SCHEMA,
            _score_value,
            usage=self.usage,
            retries=self.settings.json_retries,
            max_tokens=16,
            score_key="score",
        )
        return judged_score(value, reply.score_probs, prompts.SCORE_LOW, prompts.SCORE_HIGH)

    async def cached(self, step: str, factory: Callable[[], Awaitable[Any]]) -> Any:
        """A question-only step's result (e.g. the intent statement), computed once per (step,
        model, question): from the cache, or shared with a concurrent evaluation of the same
        question that is computing it. A failure is not cached; one waiter's cancellation does
        not cancel the others' step."""
        key = (step, self.models.llm.name, self.question)
        value = self.cache.get(key)
        if value is None:
            value = await asyncio.shield(self.cache.shared(key, factory))
            self.cache.put(key, value)
        return value


def failure_of(exc: BaseException) -> tuple[str, str]:
    """(status, message) of an exception raised while evaluating."""
    if isinstance(exc, EvaluationError):
        return exc.status, exc.message
    if isinstance(exc, ModelError):
        return getattr(exc, "status", Status.MODEL_ERROR), str(exc)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return Status.TIMEOUT, "the evaluation timed out"
    return Status.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------- validators


def _question_item(item: Any) -> tuple[str, bool]:
    if not isinstance(item, dict):
        raise ReplyError(f"expected an object with question and noncommittal, got {item!r}")
    text = item.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ReplyError(f"empty or missing question in {item!r}", Status.TOO_FEW_QUESTIONS)
    if "noncommittal" not in item:
        raise ReplyError(f"missing noncommittal flag in {item!r}")
    return text.strip(), read_flag(item["noncommittal"])


def _questions_validator(n: int) -> Callable[[Any], tuple[list[str], list[bool]]]:
    """Validates ``{"questions": [...], "noncommittal": [...]}`` (also a list of
    ``{"question", "noncommittal"}`` objects, the RAGAS shape some models prefer). A reply
    needs only one usable question: when the model wrote fewer than ``n`` (or its reply was cut
    off by its token budget, :class:`~.parsing.CutJSON`), the ones it wrote are scored, and the
    result says so (fewer ``generated_questions`` than ``strictness``; on spans
    ``relevancy.generated_questions.count``). Re-asking for the missing ones tripled the time of
    such an evaluation and still failed good answers as ``too_few_questions``."""

    def validate(data: Any) -> tuple[list[str], list[bool]]:
        if isinstance(data, CutJSON) and isinstance(data.get("questions"), list):
            # a reply cut off by its token budget: the questions written so far are kept (the
            # last one closed where it stopped); flags it did not reach count as committal
            texts = [t.strip() for t in data["questions"] if isinstance(t, str) and t.strip()][:n]
            flags = data.get("noncommittal") if isinstance(data.get("noncommittal"), list) else []
            if not texts:
                raise ReplyError("the cut reply holds no question", Status.TOO_FEW_QUESTIONS)
            return texts, [read_flag(flags[i]) if i < len(flags) else False for i in range(len(texts))]
        if isinstance(data, dict) and isinstance(data.get("questions"), list) and isinstance(data.get("noncommittal"), list):
            texts, flags = data["questions"], data["noncommittal"]
            if len(flags) < min(len(texts), n):
                raise ReplyError(f"{len(texts)} questions but {len(flags)} noncommittal flags")
            pairs = list(zip(texts, flags))
        else:
            items = data.get("questions") if isinstance(data, dict) else data
            if not isinstance(items, list):
                raise ReplyError('expected {"questions": [...], "noncommittal": [...]}')
            pairs = [(item.get("question"), item.get("noncommittal")) if isinstance(item, dict) else (None, None) for item in items]
        parsed = [(text.strip(), read_flag(flag)) for text, flag in pairs if isinstance(text, str) and text.strip()]
        if not parsed:
            raise ReplyError(f"no usable question, {n} asked for", Status.TOO_FEW_QUESTIONS)
        parsed = parsed[:n]
        return [q for q, _ in parsed], [f for _, f in parsed]

    return validate


def _score_value(data: Any) -> float:
    if not isinstance(data, dict) or "score" not in data:
        raise ReplyError(f'expected {{"score": <{prompts.SCORE_LOW}-{prompts.SCORE_HIGH}>}}', Status.UNREADABLE_SCORE)
    return read_number(data["score"], prompts.SCORE_LOW, prompts.SCORE_HIGH)


# ---------------------------------------------------------------------------- question generation


async def generate_questions(ctx: EvalContext) -> tuple[list[str], list[bool]]:
    """N questions reverse-generated from the answer, each with a noncommittal flag."""
    n = ctx.settings.strictness
    if ctx.settings.generation == "joint":
        messages = prompts.joint_questions(ctx.answer, n)
        value, reply = await ask_json(
            ctx.models.llm,
            messages,
            prompts.questions_schema(n),
            _questions_validator(n),
            usage=ctx.usage,
            retries=ctx.settings.json_retries,
            max_tokens=QUESTION_TOKENS * n + 32,
            temperature=ctx.settings.temperature,
        )
        # the exchange, kept so a judge can continue the same conversation (KV-cache reuse)
        ctx._memo["questions_conversation"] = messages + [{"role": "assistant", "content": reply.text}]
        return value
    temperature = max(ctx.settings.temperature, 0.7)  # N identical greedy questions would be pointless

    async def one(i: int) -> tuple[str, bool]:
        messages = prompts.single_question(ctx.answer)
        value, reply = await ask_json(
            ctx.models.llm,
            messages,
            prompts.QUESTION_SCHEMA,
            _question_item,
            usage=ctx.usage,
            retries=ctx.settings.json_retries,
            max_tokens=QUESTION_TOKENS + 24,
            temperature=temperature,
            seed=1000 + i,
        )
        if i == 0:
            ctx._memo["questions_conversation"] = messages + [{"role": "assistant", "content": reply.text}]
        return value

    pairs = await asyncio.gather(*(one(i) for i in range(n)))
    return [q for q, _ in pairs], [f for _, f in pairs]


def _questions(ctx: EvalContext) -> "asyncio.Future[tuple[list[str], list[bool]]]":
    return ctx.once("questions", lambda: generate_questions(ctx))


async def embedding_units(ctx: EvalContext, texts: list[str]) -> np.ndarray:
    """Unit-length embeddings of ``texts``, shape (len(texts), d): ONE embeddings request.

    Raises EvaluationError(``embedding_error``) for no embedder, a wrong vector count, or a
    zero or NaN vector.
    """
    embedder = ctx.models.embedder
    if embedder is None:
        raise EvaluationError(Status.EMBEDDING_ERROR, "no embedding model configured")
    reply = await embedder.embed(list(texts))
    ctx.usage.add(embedding_calls=1)
    vectors = np.asarray(reply.vectors, dtype=np.float32)
    expected = len(texts)
    if vectors.ndim != 2 or vectors.shape[0] != expected:
        raise EvaluationError(Status.EMBEDDING_ERROR, f"embeddings reply has {vectors.shape[0] if vectors.ndim else 0} vector(s); {expected} were sent")
    if not np.all(np.isfinite(vectors)):
        raise EvaluationError(Status.EMBEDDING_ERROR, "embeddings reply holds NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1)
    if np.any(norms < 1e-12):
        raise EvaluationError(Status.EMBEDDING_ERROR, "embeddings reply holds a zero vector")
    return vectors / norms[:, None]


async def embedding_similarities(ctx: EvalContext, generated: list[str]) -> np.ndarray:
    """Cosine similarity of each text in ``generated`` (generated questions, or the answer) to
    the original question: ONE embeddings request.

    Raises EvaluationError(``embedding_error``) for a wrong vector count, or a zero or NaN vector.
    """
    unit = await embedding_units(ctx, [ctx.question] + list(generated))
    return np.clip(unit[1:] @ unit[0], -1.0, 1.0)


#: Unit embeddings of the failure-kind example sentences, per embedder name (a few embedders
#: per process at most; computed once each, on first use).
_EXAMPLE_UNITS: dict[str, tuple[np.ndarray, np.ndarray]] = {}


async def refusal_similarities(ctx: EvalContext, answer_unit: np.ndarray) -> dict[str, float]:
    """``refusal_sources`` and ``refusal_evasion``: the largest cosine similarity of the answer's
    unit embedding to :data:`~.failure.SOURCE_REFUSALS` and to :data:`~.failure.EVASIONS`
    (read by :func:`~.failure.failure_kind`; not part of any score). The examples are embedded
    once per embedder and process (one extra embeddings request, the first time)."""
    name = getattr(ctx.models.embedder, "name", "")
    examples = _EXAMPLE_UNITS.get(name)
    if examples is None:
        units = await embedding_units(ctx, list(failure.SOURCE_REFUSALS) + list(failure.EVASIONS))
        k = len(failure.SOURCE_REFUSALS)
        examples = (units[:k], units[k:])
        if len(_EXAMPLE_UNITS) < 16:
            _EXAMPLE_UNITS[name] = examples
    sources, evasions = examples
    return {"refusal_sources": float(np.max(sources @ answer_unit)), "refusal_evasion": float(np.max(evasions @ answer_unit))}


def apply_noncommittal(similarities: np.ndarray, noncommittal: list[bool], rule: str) -> float:
    """The score from per-question similarities under a noncommittal rule.

    ``all`` (RAGAS >= 0.2): 0 when every generation is noncommittal, else the mean;
    ``any`` (RAGAS 0.1): 0 when any generation is noncommittal, else the mean;
    ``per_question`` (a sufficiency flag per generated question, as in Peng Xia's Chinese
    walk-through of RAGAS): mean of similarity_i * (1 - noncommittal_i).
    """
    sims = np.asarray(similarities, dtype=np.float64)
    flags = np.asarray(noncommittal, dtype=bool)
    if rule == "per_question":
        return float(np.mean(sims * (~flags)))
    if rule == "any":
        return 0.0 if flags.any() else float(sims.mean())
    return 0.0 if flags.all() else float(sims.mean())


# ---------------------------------------------------------------------------- methods


async def ragas(ctx: EvalContext) -> MethodOutput:
    """RAGAS answer relevancy: mean cosine similarity of reverse-generated questions (Es et al. 2023)."""
    questions, flags = await _questions(ctx)
    sims = await embedding_similarities(ctx, questions)
    score = apply_noncommittal(sims, flags, ctx.settings.noncommittal)
    return MethodOutput(score=score, generated_questions=questions, similarities=[float(s) for s in sims], noncommittal=flags)


async def llm_similarity(ctx: EvalContext) -> MethodOutput:
    """Reverse-generated questions rated for similarity by the LLM on the multi-method article's scale."""
    questions, flags = await _questions(ctx)
    n = len(questions)

    def validate(data: Any) -> list[float]:
        ratings = data.get("ratings") if isinstance(data, dict) else data
        if not isinstance(ratings, list) or len(ratings) != n:
            raise ReplyError(f"expected {n} ratings, got {ratings!r}", Status.UNREADABLE_SCORE)
        return [read_number(r, 0.0, 1.0) for r in ratings]

    ratings = await ctx.ask(prompts.similarity_ratings(ctx.question, questions), prompts.similarity_schema(n), validate, max_tokens=12 * n + 24)
    score = apply_noncommittal(np.asarray(ratings), flags, ctx.settings.noncommittal)
    return MethodOutput(score=score, generated_questions=questions, similarities=ratings, noncommittal=flags)


async def direct(ctx: EvalContext) -> MethodOutput:
    """The LLM rates how well the answer addresses the question, 1-5 -> [0, 1] (the multi-method article's direct scoring)."""
    return MethodOutput(score=await ctx.ask_score(prompts.direct_score(ctx.question, ctx.answer)))


async def decomposition(ctx: EvalContext) -> MethodOutput:
    """Share of the question's sub-questions (information needs) the answer addresses (the multi-method article's decomposition)."""

    def validate_subs(data: Any) -> tuple[str, ...]:
        items = data.get("sub_questions") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ReplyError('expected {"sub_questions": [...]}')
        subs = tuple(s.strip() for s in items if isinstance(s, str) and s.strip())
        if not subs:
            raise ReplyError("no sub-question")
        return subs[:5]

    subs = await ctx.cached("decompose", lambda: ctx.ask(prompts.decompose(ctx.question), prompts.DECOMPOSE_SCHEMA, validate_subs, max_tokens=160))
    k = len(subs)

    def validate_cover(data: Any) -> list[bool]:
        flags = data.get("addressed") if isinstance(data, dict) else data
        if not isinstance(flags, list) or len(flags) != k:
            raise ReplyError(f"expected {k} true/false values, got {flags!r}")
        return [read_flag(f) for f in flags]

    addressed = await ctx.ask(prompts.coverage(ctx.answer, subs), prompts.coverage_schema(k), validate_cover, max_tokens=8 * k + 16)
    return MethodOutput(score=sum(addressed) / k, sub_questions=list(subs), sub_questions_addressed=addressed)


async def intent(ctx: EvalContext) -> MethodOutput:
    """The question's intent is stated, then the answer's fulfilment of it is scored (the multi-method article's intent match)."""

    def validate_intent(data: Any) -> str:
        text = data.get("intent") if isinstance(data, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ReplyError('expected {"intent": "..."}')
        return text.strip()

    stated = await ctx.cached("intent", lambda: ctx.ask(prompts.intent(ctx.question), prompts.INTENT_SCHEMA, validate_intent, max_tokens=80))
    score = await ctx.ask_score(prompts.fulfilment(ctx.question, ctx.answer, stated))
    return MethodOutput(score=score, intent=stated)


#: ragas_intent's weights, chosen on WikiEval (docs/quality.md): the middle of the
#: 0.1-0.3 range of RAGAS shares that keep pairwise accuracy at 1.0 with the local models (0.5
#: falls to 0.7). Measured: pairwise accuracy 1.00 on WikiEval's 10 dev rows with the embedded
#: models (18.4 s per evaluation on 2 cores), against 0.60 for ``ragas`` alone.
RAGAS_INTENT_WEIGHTS = (("ragas", 0.2), ("intent", 0.8))


#: ragas_judge's combination (part of the evaluator fingerprint), chosen on the development
#: sets' fit subsets and checked on the held-out rest (docs/methods.md and docs/quality.md):
#: ``raw = (judge_weight * judge + topicality_weight * min(topical, cap)) / (judge_weight +
#: topicality_weight * cap)`` with ``topical = min(max(answer_similarity, ragas), ceiling)``:
#: the answer is about the question (the larger of its own embedding similarity to the question
#: and the RAGAS score), up to a ceiling set by what it says beyond the question. The ceiling is
#: the larger of ``residual_scale * residual_similarity`` (the embedding similarity of
#: :func:`~.restatement.residual`, the answer without the question's words) and ``cap *
#: ramp(novelty)`` (:func:`~.restatement.novelty`, 0 at ``novelty_ramp[0]`` and below, 1 at
#: ``novelty_ramp[1]`` and above). An answer that restates the question (novelty about 0,
#: nothing left to embed), or names it to say the documents do not answer it (novelty mostly
#: 0.2-0.7, a residual like "Based on the context provided, there is no direct answer to the"
#: far from the question), has a high answer similarity and RAGAS score but a low ceiling; an
#: answer that is mostly new content (novelty >= 0.8: 69% of the pair sets' reference answers) is not
#: touched. raw lies in [0, 1] for non-negative similarities. The cap makes topicality a floor
#: check: above it the judge decides (on-topic answers vary in depth), below it marks evasive,
#: off-topic, padded, echoed and hedging answers.
RAGAS_JUDGE = {
    "judge_weight": 0.5,
    "topicality_weight": 2.0,
    "cap": 0.45,
    "residual_scale": 1.5,
    "novelty_ramp": (0.5, 0.8),
    "topical": "min(max(answer_similarity, ragas), max(residual_scale * residual_similarity, cap * ramp(novelty)))",
    "residual": "answer without the question's words and numbers (case-insensitive) and without CJK characters of bigrams the question holds; empty -> similarity 0",
}


def ragas_judge_topical(answer_similarity: float, ragas: float, residual_similarity: float, novelty: float) -> float:
    """ragas_judge's topical signal before the cap (see :data:`RAGAS_JUDGE`), roughly in [0, 1].

    The larger of two embedding views of "is this answer about the question": the answer's own
    similarity to it and the RAGAS score; either alone has blind spots (the multilingual USE
    embeds "What does the with statement do?" far from a correct answer about context managers,
    0.09, while the generated questions restate the topic, 0.52). Both reward an answer that
    repeats the question (the question regenerated from the question is the question), so they
    count only up to the ceiling of what the answer adds: the residual's similarity (scaled),
    or the novelty ramp.
    """
    low, high = RAGAS_JUDGE["novelty_ramp"]
    ramp = min(1.0, max(0.0, (novelty - low) / (high - low)))
    ceiling = max(RAGAS_JUDGE["residual_scale"] * residual_similarity, RAGAS_JUDGE["cap"] * ramp)
    return min(max(answer_similarity, ragas), ceiling)


def ragas_judge_raw(judge: float, answer_similarity: float, ragas: float, residual_similarity: float, novelty: float) -> float:
    """ragas_judge's raw score in [0, 1] from its components: the judge and the capped topical
    signal (:func:`ragas_judge_topical`), weighted (see :data:`RAGAS_JUDGE`). Above the cap the
    judge decides. The components are kept on every result."""
    topical = min(ragas_judge_topical(answer_similarity, ragas, residual_similarity, novelty), RAGAS_JUDGE["cap"])
    numerator = RAGAS_JUDGE["judge_weight"] * judge + RAGAS_JUDGE["topicality_weight"] * topical
    return numerator / (RAGAS_JUDGE["judge_weight"] + RAGAS_JUDGE["topicality_weight"] * RAGAS_JUDGE["cap"])


async def judge_after_questions(ctx: EvalContext) -> float:
    """The ``direct`` judgement, asked as a second turn after the RAGAS question generation:
    the model has just restated what the answer answers, then rates 1-5 how well it addresses
    the user's question (expected value over the digits, G-Eval). One more request, whose prompt
    is the first turn plus the question (a KV-cache hit for local models and servers with
    prefix caching)."""
    await _questions(ctx)
    conversation = ctx._memo["questions_conversation"]  # joint: the exchange; independent: the first
    return await ctx.ask_score(prompts.judge_turn(conversation, ctx.question))


async def ragas_judge(ctx: EvalContext) -> MethodOutput:
    """The default: RAGAS reverse-generated questions (evidence, and context for the judge), a
    1-5 judgement of how well the answer addresses the question asked after them, and the
    answer's topicality (see :func:`ragas_judge_raw`), combined by :func:`ragas_judge_raw`. Two
    chat requests and one embeddings request per evaluation (the residual rides in it).

    Components: ``judge``, ``ragas``, ``answer_similarity`` (the answer's embedding similarity
    to the question), ``residual_similarity`` (the same for :func:`~.restatement.residual`, 0
    when nothing is left), ``novelty`` (:func:`~.restatement.novelty`) and ``topicality``
    (:func:`ragas_judge_topical`, before the cap)."""
    questions, flags = await _questions(ctx)
    judged = await judge_after_questions(ctx)
    rest = restatement.residual(ctx.question, ctx.answer)
    sims = await embedding_similarities(ctx, list(questions) + [ctx.answer] + ([rest] if rest else []))
    k = len(questions)
    question_sims, answer_sim = sims[:k], float(sims[k])
    residual_sim = float(sims[k + 1]) if rest else 0.0
    ragas_score = apply_noncommittal(question_sims, flags, ctx.settings.noncommittal)
    new = restatement.novelty(ctx.question, ctx.answer)
    raw = ragas_judge_raw(judged, answer_sim, ragas_score, residual_sim, new)
    return MethodOutput(
        score=raw,
        generated_questions=questions,
        similarities=[float(x) for x in question_sims],
        noncommittal=flags,
        components={
            "judge": judged,
            "topicality": ragas_judge_topical(answer_sim, ragas_score, residual_sim, new),
            "ragas": ragas_score,
            "answer_similarity": answer_sim,
            "residual_similarity": residual_sim,
            "novelty": new,
        },
    )


#: ragas_judge_intent's combination (the default; part of the evaluator fingerprint), chosen on
#: the development sets' fit subsets from the stored components of ``ragas_judge`` and
#: ``intent`` runs and checked on the held-out rest (docs/methods.md, figures in docs/quality.md):
#: ``raw = (judges + min(topical, cap)) / (1 + cap)`` with ``judges = 0.25 * judge + 0.75 *
#: intent`` (renormalised over the judges that succeeded) and ``topical = min(max(
#: answer_similarity, ragas), cap * ramp(novelty))``, the ramp 0 at ``novelty_ramp[0]`` and
#: below, 1 at ``novelty_ramp[1]`` and above. The intent judge (the ``intent`` method) sees the question
#: and answer without the generated questions, which for an answer that restates the
#: question are the question itself; it ranks padded and short Wikipedia-style answers where
#: the second-turn judge does not, and its weakness, restated questions (it rates an echo as
#: fulfilling the intent), is what the novelty ramp takes the topical credit from. raw lies in
#: [0, 1] for non-negative similarities.
RAGAS_JUDGE_INTENT = {
    "judges": (("judge", 0.25), ("intent", 0.75)),
    "cap": 0.5,
    "novelty_ramp": (0.1, 0.4),
    "topical": "min(max(answer_similarity, ragas), cap * ramp(novelty))",
    "raw": "(judges + min(topical, cap)) / (1 + cap)",
}


def ragas_judge_intent_topical(answer_similarity: float, ragas: float, novelty: float) -> float:
    """ragas_judge_intent's topical signal before the cap, roughly in [-1, 1]: the larger of the
    answer's own embedding similarity to the question and the RAGAS score, up to ``cap *
    ramp(novelty)`` (:data:`RAGAS_JUDGE_INTENT`; :func:`~.restatement.novelty` is the share of
    the answer that is not the question's words): an answer that restates the question gets
    none, one that is mostly new content keeps it whole."""
    low, high = RAGAS_JUDGE_INTENT["novelty_ramp"]
    ramp = min(1.0, max(0.0, (novelty - low) / (high - low)))
    return min(max(answer_similarity, ragas), RAGAS_JUDGE_INTENT["cap"] * ramp)


def ragas_judge_intent_raw(judges: dict[str, float], answer_similarity: float, ragas: float, novelty: float) -> float:
    """ragas_judge_intent's raw score in [0, 1] (for non-negative similarities) from its components.

    Args:
        judges: the 1-5 judgements as [0, 1] scores that succeeded, ``{"judge": ..., "intent":
            ...}`` (at least one); their weights (:data:`RAGAS_JUDGE_INTENT`) are renormalised
            over the ones given.
        answer_similarity, ragas, novelty: see :func:`ragas_judge_intent_topical`.

    Raises ValueError when ``judges`` holds none of the judges.
    """
    weights = {name: w for name, w in RAGAS_JUDGE_INTENT["judges"] if name in judges}
    if not weights:
        raise ValueError(f"no judgement among {sorted(judges)}")
    judged = sum(w * judges[name] for name, w in weights.items()) / sum(weights.values())
    cap = RAGAS_JUDGE_INTENT["cap"]
    return (judged + min(ragas_judge_intent_topical(answer_similarity, ragas, novelty), cap)) / (1.0 + cap)


async def ragas_judge_intent(ctx: EvalContext) -> MethodOutput:
    """The default: ``ragas_judge``'s conversation (RAGAS reverse-generated questions, then the
    1-5 judgement of how well the answer addresses the question), the ``intent`` method's judgement
    (the question's intent stated, cached per question, then the answer's fulfilment of it
    rated 1-5) run beside it, and the answer's topicality up to what it adds beyond the
    question; combined by :func:`ragas_judge_intent_raw`. Three chat requests per evaluation
    (plus the intent statement once per question) and one embeddings request.

    A judge that fails (e.g. an unreadable reply) leaves the other's weight alone
    (``failed_components``); the evaluation fails only when both do or the questions do.

    Components: ``judge``, ``intent``, ``ragas``, ``answer_similarity``, ``novelty``,
    ``topicality`` (:func:`ragas_judge_intent_topical`, before the cap), and
    ``refusal_sources`` / ``refusal_evasion`` (:func:`refusal_similarities`, read by the failure
    kind only)."""
    judged, fulfilled = await asyncio.gather(judge_after_questions(ctx), intent(ctx), return_exceptions=True)
    for outcome in (judged, fulfilled):
        if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
            raise outcome  # cancellation and exits propagate
    questions, flags = await _questions(ctx)  # done: the judge continued its conversation
    units = await embedding_units(ctx, [ctx.question] + list(questions) + [ctx.answer])
    sims = np.clip(units[1:] @ units[0], -1.0, 1.0)
    k = len(questions)
    question_sims, answer_sim = sims[:k], float(sims[k])
    refusals = await refusal_similarities(ctx, units[-1])
    ragas_score = apply_noncommittal(question_sims, flags, ctx.settings.noncommittal)
    new = restatement.novelty(ctx.question, ctx.answer)
    repeated: dict[str, float] = {}
    if ctx.history:  # an answer repeating an earlier answer adds nothing to the conversation
        repeated["repeat"] = conversation.repeat(ctx.answer, ctx.history)
        new = min(new, 1.0 - repeated["repeat"])
    judges: dict[str, float] = {}
    failed: dict[str, str] = {}
    for name, outcome in (("judge", judged), ("intent", fulfilled)):
        if isinstance(outcome, BaseException):
            failed[name] = failure_of(outcome)[0]
        else:
            judges[name] = outcome if name == "judge" else outcome.score
    if not judges:
        raise judged  # type: ignore[misc]  # both judges failed: the first one's failure
    return MethodOutput(
        score=ragas_judge_intent_raw(judges, answer_sim, ragas_score, new),
        generated_questions=questions,
        similarities=[float(x) for x in question_sims],
        noncommittal=flags,
        components={
            **judges,
            "topicality": ragas_judge_intent_topical(answer_sim, ragas_score, new),
            "ragas": ragas_score,
            "answer_similarity": answer_sim,
            "novelty": new,
            **refusals,
            **repeated,
        },
        failed_components=failed,
        intent=None if isinstance(fulfilled, BaseException) else fulfilled.intent,
    )


async def weighted(ctx: EvalContext, weights_setting: Sequence[tuple[str, float]]) -> MethodOutput:
    """Weighted mean of component methods; weights renormalised over the components that succeeded.

    Components run concurrently; every component's score is kept, failures are recorded in
    ``failed_components``. Fails only when every component failed.
    """
    weights = [(name, w) for name, w in weights_setting if w > 0]
    outcomes = await asyncio.gather(*(METHODS[name].score(ctx) for name, _ in weights), return_exceptions=True)
    merged = MethodOutput(score=0.0)
    total = 0.0
    first_failure: Optional[BaseException] = None
    for (name, weight), outcome in zip(weights, outcomes):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # cancellation and exits propagate
            merged.failed_components[name] = failure_of(outcome)[0]
            first_failure = first_failure or outcome
            continue
        merged.components[name] = outcome.score
        merged.score += weight * outcome.score
        total += weight
        if outcome.generated_questions and not merged.generated_questions:
            merged.generated_questions = outcome.generated_questions
            merged.noncommittal = outcome.noncommittal
        if name == "ragas" or (outcome.similarities and not merged.similarities):
            merged.similarities = outcome.similarities
        if outcome.sub_questions:
            merged.sub_questions, merged.sub_questions_addressed = outcome.sub_questions, outcome.sub_questions_addressed
        if outcome.intent:
            merged.intent = outcome.intent
    if total == 0.0:
        assert first_failure is not None
        raise first_failure
    merged.score /= total
    return merged


# ---------------------------------------------------------------------------- the registry
# Prompts for the fingerprint: the rendered prompts and JSON schemas a method sends, with
# placeholder texts (QUESTION, ANSWER, ...), so a change of any prompt changes the evaluator.


def _question_prompts(settings: Settings) -> list[Any]:
    n = settings.strictness
    if settings.generation == "joint":
        return [prompts.joint_questions("ANSWER", n), prompts.questions_schema(n)]
    return [prompts.single_question("ANSWER"), prompts.QUESTION_SCHEMA]


def _ragas_judge_prompts(settings: Settings) -> list[Any]:
    questions = _question_prompts(settings)
    judge = prompts.judge_turn(questions[0] + [{"role": "assistant", "content": "REPLY"}], "QUESTION")
    return questions + [judge, prompts.SCORE_SCHEMA, RAGAS_JUDGE]


def _intent_prompts(settings: Settings) -> list[Any]:
    return [prompts.intent("QUESTION"), prompts.INTENT_SCHEMA, prompts.fulfilment("QUESTION", "ANSWER", "INTENT"), prompts.SCORE_SCHEMA]


def _ragas_judge_intent_prompts(settings: Settings) -> list[Any]:
    questions = _question_prompts(settings)
    judge = prompts.judge_turn(questions[0] + [{"role": "assistant", "content": "REPLY"}], "QUESTION")
    return questions + [judge, prompts.SCORE_SCHEMA] + _intent_prompts(settings) + [RAGAS_JUDGE_INTENT]


@dataclass(frozen=True)
class Method:
    """One relevancy method: everything the engine, the settings and the evaluator identity
    need of it. Adding a method is one entry in :data:`METHODS`.

    Attributes:
        name: the ``method`` setting's value (and the component name in weights).
        run: ``async (EvalContext) -> MethodOutput`` of a single method; None for a composite.
        prompts: ``(Settings) -> list``: the prompts and schemas it sends, rendered with
            placeholder texts; part of the raw fingerprint. None for a composite.
        weights: a composite's ``(Settings) -> ((component, weight), ...)``: its score is
            :func:`weighted` over those components, and its prompts are the weights and the
            components' prompts. None for a single method.
        component: may be a component of ``combined`` (validated by the ``combined_weights``
            setting).

    Calibrations for it ship as ``relevancy_tracer/calibrations/<name>-*.json``
    (:attr:`calibration_glob`; ``calibration="auto"`` applies the one whose raw fingerprint
    matches).
    """

    name: str
    run: Optional[Callable[[EvalContext], Awaitable[MethodOutput]]] = None
    prompts: Optional[Callable[[Settings], list[Any]]] = None
    weights: Optional[Callable[[Settings], Sequence[tuple[str, float]]]] = None
    component: bool = False

    def __post_init__(self) -> None:
        if (self.run is None) == (self.weights is None) or (self.run is None) != (self.prompts is None):
            raise ValueError(f"method {self.name}: give run and prompts, or weights")

    async def score(self, ctx: EvalContext) -> MethodOutput:
        """Score one evaluation. Raises EvaluationError or ModelError (see the module doc)."""
        if self.weights is not None:
            return await weighted(ctx, self.weights(ctx.settings))
        return await self.run(ctx)  # type: ignore[misc]

    def fingerprint_prompts(self, settings: Settings) -> list[Any]:
        """What of this method goes into the raw fingerprint for ``settings``."""
        if self.weights is None:
            return self.prompts(settings)  # type: ignore[misc]
        weights = self.weights(settings)
        out: list[Any] = [["weights", [list(w) for w in weights]]]
        for name, _ in weights:
            out.extend(METHODS[name].fingerprint_prompts(settings))
        return out

    @property
    def calibration_glob(self) -> str:
        """File pattern of its shipped calibrations in ``relevancy_tracer/calibrations``."""
        return f"{self.name}-*.json"


def _registry(*methods: Method) -> dict[str, Method]:
    for method in methods:
        config.register_method(method.name, component=method.component)
    return {method.name: method for method in methods}


#: Every relevancy method, in the order the configuration reference lists them.
METHODS: dict[str, Method] = _registry(
    Method("ragas_judge_intent", ragas_judge_intent, _ragas_judge_intent_prompts),
    Method("ragas_judge", ragas_judge, _ragas_judge_prompts),
    Method("ragas_intent", weights=lambda settings: RAGAS_INTENT_WEIGHTS),
    Method("ragas", ragas, _question_prompts, component=True),
    Method(
        "llm_similarity",
        llm_similarity,
        lambda s: _question_prompts(s) + [prompts.similarity_ratings("QUESTION", ["GENERATED"] * s.strictness), prompts.similarity_schema(s.strictness)],
        component=True,
    ),
    Method("direct", direct, lambda s: [prompts.direct_score("QUESTION", "ANSWER"), prompts.SCORE_SCHEMA], component=True),
    Method(
        "decomposition",
        decomposition,
        lambda s: [prompts.decompose("QUESTION"), prompts.DECOMPOSE_SCHEMA, prompts.coverage("ANSWER", ["SUB"]), prompts.coverage_schema(1)],
        component=True,
    ),
    Method("intent", intent, _intent_prompts, component=True),
    Method("combined", weights=lambda settings: settings.combined_weights),
)
