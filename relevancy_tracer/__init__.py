"""relevancy-tracer: answer relevancy of RAG answers, scored in the background, on OpenTelemetry spans.

Tracing::

    import relevancy_tracer

    relevancy_tracer.configure()          # OTLP exporters from OTEL_* when the app has none

    @relevancy_tracer.trace
    def answer(question: str) -> str:
        ...

Samplers for ``configure(sampler=...)`` are in :mod:`relevancy_tracer.samplers`.

Engine (batch and ad hoc scoring)::

    import relevancy_tracer
    result = relevancy_tracer.score("Where is France and what is its capital?",
                                    "France is in western Europe and Paris is its capital.")
    result.score, result.label, result.generated_questions
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from .tracing import lifecycle
from .config import Settings
from .dataset.columns import ColumnMapping
from .tracing.decorator import instrument, trace
from .tracing.drift import DriftEvent, DriftMonitor
from .tracing.extraction import CallInfo
from .result import RelevancyResult, Status
from .tracing.sampling import SamplingContext
from .tracing.job import EvaluationOutcome
from .tracing.lifecycle import configure, flush, shutdown
from .scoring.engine import Engine
from ._version import __version__


def score(question: Any, answer: Any, contexts: Any = None, *, history: Any = None, **overrides: Any) -> RelevancyResult:
    """Score the relevancy of ``answer`` to ``question`` with the configured engine (blocking).

    Args:
        question, answer: non-empty str (the question: the user's last turn). contexts:
            list[str], recorded only.
        history: the conversation's earlier turns, oldest first, as a list of
            ``{"role": "user" | "assistant", "content": str}`` messages (LangChain and
            LlamaIndex messages too), or None. The last turn is then judged in its
            conversation (see :meth:`Engine.ascore`); ``result.standalone_question`` is what
            the answer was judged against.
        **overrides: per-call settings, e.g. ``strictness=5``, ``method="direct"``,
            ``noncommittal="any"`` (see docs/configuration.md).

    Returns:
        :class:`RelevancyResult`; ``result.status == "scored"`` with a finite ``score``, or a
        named failure status with ``error`` set. Bad data and model failures never raise.

    Raises:
        TypeError, ValueError: an unknown override or an out-of-range override value.
    """
    return lifecycle.get_engine().score(question, answer, contexts, history=history, **overrides)


async def ascore(question: Any, answer: Any, contexts: Any = None, *, history: Any = None, **overrides: Any) -> RelevancyResult:
    """Async :func:`score`."""
    return await lifecycle.get_engine().ascore(question, answer, contexts, history=history, **overrides)


def evaluate(
    rows: Iterable[Any],
    *,
    concurrency: Optional[int] = None,
    as_dataframe: bool = False,
    mapping: Optional[ColumnMapping] = None,
    **overrides: Any,
) -> Any:
    """Score many rows concurrently (at most ``concurrency`` at once, default the setting).

    ``rows``: dicts or a pandas DataFrame with question/answer/contexts (or
    user_input/response/retrieved_contexts) columns and an optional ``history`` column (the
    earlier turns: a list of ``{"role", "content"}`` messages, or its JSON text); ``mapping``
    selects others.
    Returns ``list[RelevancyResult]`` in row order, or a pandas DataFrame with
    ``as_dataframe=True``. Never raises for bad rows: they get status ``invalid_input``.
    """
    return lifecycle.get_engine().evaluate(rows, concurrency=concurrency, as_dataframe=as_dataframe, mapping=mapping, **overrides)


def local_chat_model(model: str = "qwen2.5-coder-1.5b", *, threads: Optional[int] = None) -> Any:
    """An embedded local chat model for the app's own generation (the example RAG app answers
    with it). With ``local_host`` on (the default) it is the machine's model host's model, the
    one the scorer uses (one llama.cpp context, whose decoder batches the app's generations
    with the scorer's requests); with ``RELEVANCY_TRACER_LOCAL_HOST=0`` an in-process instance
    of its own with ``threads`` CPU threads (default: the CPUs this process may use).

    Args:
        model: a local model name (docs/models.md), default ``qwen2.5-coder-1.5b``.
        threads: CPU threads of an in-process model (ignored with the model host).

    Returns:
        An object whose ``generate(messages, *, max_tokens=256, temperature=0.0) -> str``
        answers OpenAI-style chat ``messages``, blocking; the model loads on the first call.

    Nothing raises here: a model that cannot be loaded (unknown, or no ``local`` extra) makes
    ``generate`` raise, as a failed generation does.
    """
    from .scoring.backends import build_llm

    settings = Settings.resolve(llm="local", llm_model=model)
    if settings.local_host:
        return build_llm(settings)
    from .models.local_llm import LocalChatModel

    return LocalChatModel(model, threads=threads)


def local_embedder(model: str = "use-multilingual-v3") -> Any:
    """An embedded local embedding model for the app's own retrieval (the example RAG app
    embeds its passages with it): the model host's with ``local_host`` on (the default), else
    one in this process, shared with the scorer.

    Args:
        model: a local embedding model name (docs/models.md), default ``use-multilingual-v3``.

    Returns:
        An object with ``name`` (the model name) and ``embed_sync(texts) -> numpy.ndarray``:
        (n, d) float32 L2-normalised vectors, blocking; the model loads on the first call.

    Nothing raises here: a model that cannot be loaded (unknown, or its extra missing) makes
    ``embed_sync`` raise, as a failed embedding does.
    """
    from .scoring.backends import build_embedder

    return build_embedder(Settings.resolve(embeddings="local", embedding_model=model))


#: Names importable from the package before the samplers had a public module of their own:
#: still importable from here, with a DeprecationWarning (see :func:`__getattr__`).
_MOVED_TO_SAMPLERS = ("AllOf", "AlwaysOff", "AlwaysOn", "CallableSampler", "RateLimitSampler", "TraceIdRatioSampler")


def __getattr__(name: str) -> Any:
    """``relevancy_tracer.AllOf`` and the other sampler classes of :data:`_MOVED_TO_SAMPLERS`:
    the class from :mod:`relevancy_tracer.samplers`, with a DeprecationWarning. Raises
    AttributeError for any other unknown name."""
    if name in _MOVED_TO_SAMPLERS:
        import warnings

        from . import samplers

        warnings.warn(
            f"relevancy_tracer.{name} is deprecated: import it from relevancy_tracer.samplers",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(samplers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def drift_monitor() -> Optional[DriftMonitor]:
    """The current tracer's drift monitor (None when ``drift_detection`` is off or after
    ``shutdown()``)."""
    runtime = lifecycle.current()
    return runtime.drift if runtime is not None else None


#: What the documentation teaches (docs/architecture.md, "The public API"; tests/test_public_api.py
#: checks each is taught). The samplers are in relevancy_tracer.samplers.
__all__ = [
    "CallInfo",
    "ColumnMapping",
    "DriftEvent",
    "DriftMonitor",
    "Engine",
    "EvaluationOutcome",
    "RelevancyResult",
    "SamplingContext",
    "Settings",
    "Status",
    "__version__",
    "ascore",
    "configure",
    "drift_monitor",
    "evaluate",
    "flush",
    "instrument",
    "local_chat_model",
    "local_embedder",
    "score",
    "shutdown",
    "trace",
]
