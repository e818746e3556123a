"""relevancy-tracer: answer relevancy of RAG answers, scored in the background, on OpenTelemetry spans.

Tracing::

    import relevancy_tracer

    relevancy_tracer.configure()          # OTLP exporters from OTEL_* when the app has none

    @relevancy_tracer.trace
    def answer(question: str) -> str:
        ...

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
from .dataset import ColumnMapping
from .tracing.decorator import instrument, trace
from .tracing.drift import DriftEvent, DriftMonitor
from .tracing.extraction import CallInfo
from .result import RelevancyResult, Status
from .tracing.sampling import AllOf, AlwaysOff, AlwaysOn, CallableSampler, RateLimitSampler, SamplingContext, TraceIdRatioSampler
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


def drift_monitor() -> Optional[DriftMonitor]:
    """The current tracer's drift monitor (None when ``drift_detection`` is off or after
    ``shutdown()``)."""
    runtime = lifecycle.current()
    return runtime.drift if runtime is not None else None


__all__ = [
    "AllOf",
    "AlwaysOff",
    "AlwaysOn",
    "CallInfo",
    "CallableSampler",
    "ColumnMapping",
    "DriftEvent",
    "DriftMonitor",
    "Engine",
    "EvaluationOutcome",
    "RateLimitSampler",
    "RelevancyResult",
    "SamplingContext",
    "Settings",
    "Status",
    "TraceIdRatioSampler",
    "__version__",
    "ascore",
    "configure",
    "drift_monitor",
    "evaluate",
    "flush",
    "instrument",
    "score",
    "shutdown",
    "trace",
]
