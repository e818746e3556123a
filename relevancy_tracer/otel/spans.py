"""Writing content and relevancy results onto spans, and instrumentation suppression."""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Optional, Sequence

from opentelemetry import context as otel_context

from ..result import RelevancyResult
from . import attributes as A

#: Context keys instrumentations check before creating spans: OpenTelemetry's (also used by
#: OpenInference) and OpenLLMetry's language-model key.
_SUPPRESS_KEYS = ("suppress_instrumentation", "suppress_language_model_instrumentation")


@contextlib.contextmanager
def suppressed_instrumentation() -> Iterator[None]:
    """Run the block with OpenTelemetry instrumentation suppressed.

    The scorer's own model calls (the ``openai`` client, httpx) run inside it, so an app that
    instruments those libraries never sees the scorer's requests as app spans.
    """
    ctx = otel_context.get_current()
    for key in _SUPPRESS_KEYS:
        ctx = otel_context.set_value(key, True, ctx)
    # OpenTelemetry's own key object, looked up by name for API versions that export it
    try:
        from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY  # type: ignore[attr-defined]

        ctx = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True, ctx)
    except ImportError:  # pragma: no cover - older API
        pass
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


#: A UTF-16 surrogate code point: never valid on its own in a str that is to be UTF-8 encoded.
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (lone surrogates such as ``"\\ud800"``,
    common in JSON from clients) replaced by U+FFFD, so encoding the export batch cannot fail.
    Costs one encode attempt for clean text."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (with a marker when cut) and made encodable
    (:func:`encodable`). Cut first: the repair replaces one character by one, so cutting
    first gives the same text, and the cost is O(``limit``) whatever the length of ``text``
    (a 10 MB answer with a lone surrogate costs what 8,000 characters cost)."""
    if len(text) > limit:
        text = text[: max(0, limit - 15)] + "...[truncated]"
    return encodable(text)


def content_attributes(question: Optional[str], answer: Optional[str], contexts: Optional[Sequence[str]], limit: int) -> dict[str, Any]:
    """OpenInference content attributes: input.value, output.value, retrieval documents.

    ``input.mime_type`` / ``output.mime_type`` are left out: OpenInference's default is text,
    and two fewer attributes is 2 of the ~3 us the tracer adds to an unsampled call.
    """
    attrs: dict[str, Any] = {}
    if question is not None:
        attrs[A.INPUT_VALUE] = clip(question, limit)
    if answer is not None:
        attrs[A.OUTPUT_VALUE] = clip(answer, limit)
    for index, document in enumerate(contexts or ()):
        attrs[A.RETRIEVAL_DOCUMENT_CONTENT.format(index=index)] = clip(document, limit)
    return attrs


def result_attributes(result: RelevancyResult, *, capture_content: bool, limit: int) -> dict[str, Any]:
    """The ``relevancy.*`` attributes of a result.

    Scores (the reported score, the raw score and whether it is calibrated), label, status,
    evaluator version, models, usage and timing always; texts derived from the question or
    answer (generated questions, sub-questions, intent) only when ``capture_content``.
    """
    attrs: dict[str, Any] = {
        A.STATUS: "scored" if result.ok else "error",
        A.METHOD: result.method,
        A.STRICTNESS: result.strictness,
        A.LATENCY_MS: round(float(result.latency_ms), 3),
        A.INPUT_TOKENS: int(result.input_tokens),
        A.OUTPUT_TOKENS: int(result.output_tokens),
    }
    if result.llm_model:
        attrs[A.LLM_MODEL] = result.llm_model
    if result.embedding_model:
        attrs[A.EMBEDDING_MODEL] = result.embedding_model
    if result.truncated:
        attrs[A.TRUNCATED] = True
    if result.history_status:
        attrs[A.HISTORY_STATUS] = result.history_status
        attrs[A.HISTORY_TURNS] = int(result.history_turns)
    if result.evaluator_version:
        attrs[A.EVALUATOR_VERSION] = result.evaluator_version
    if result.ok:
        attrs[A.SCORE] = float(result.score)  # type: ignore[arg-type]
        if result.raw_score is not None:
            attrs[A.RAW_SCORE] = float(result.raw_score)
        attrs[A.CALIBRATED] = bool(result.calibrated)
        attrs[A.LABEL] = result.label
        attrs[A.EXPLANATION] = result.explanation
        if result.failure_kind:
            attrs[A.FAILURE_KIND] = result.failure_kind
        if result.evidence is not None:
            attrs[A.EVIDENCE] = float(result.evidence)
        if result.prior is not None:
            attrs[A.PRIOR] = float(result.prior)
        if result.similarities:
            attrs[A.SIMILARITIES] = [float(s) for s in result.similarities]
        if result.noncommittal:
            attrs[A.NONCOMMITTAL] = [bool(f) for f in result.noncommittal]
        if result.generated_questions and len(result.generated_questions) < result.strictness:
            attrs[A.GENERATED_QUESTIONS_COUNT] = len(result.generated_questions)
        for name, value in result.components.items():
            attrs[A.COMPONENT.format(name=name)] = float(value)
        if result.sub_questions_addressed:
            attrs[A.SUB_QUESTIONS_ADDRESSED] = [bool(f) for f in result.sub_questions_addressed]
        if capture_content:
            if result.generated_questions:
                attrs[A.GENERATED_QUESTIONS] = [clip(q, limit) for q in result.generated_questions]
            if result.sub_questions:
                attrs[A.SUB_QUESTIONS] = [clip(q, limit) for q in result.sub_questions]
            if result.intent:
                attrs[A.INTENT] = clip(result.intent, limit)
            if result.standalone_question:
                attrs[A.STANDALONE_QUESTION] = clip(result.standalone_question, limit)
    else:
        attrs[A.ERROR_TYPE] = result.status
        if result.error and capture_content:  # an error message may quote the model's reply
            attrs[A.ERROR] = clip(result.error, limit)
    if result.failed_components:
        attrs[A.FAILED_COMPONENTS] = [f"{name}:{status}" for name, status in result.failed_components.items()]
    return attrs


def exception_type(exc: BaseException) -> str:
    """``module.QualName`` of an exception's type (OpenTelemetry's ``exception.type``)."""
    kind = type(exc)
    module = getattr(kind, "__module__", "") or ""
    return kind.__qualname__ if module in ("builtins", "") else f"{module}.{kind.__qualname__}"


STACKTRACE_FRAMES = 32
"""Frames of ``exception.stacktrace`` per exception of the chain, from the traced function's own
frame down. A RecursionError passing through N traced levels is recorded N times, each with the
depth below it: unbounded, that was O(N^2) frames on the app's thread (1.9 s for 329 levels)."""


def format_stacktrace(exc: BaseException, frames: int = STACKTRACE_FRAMES) -> str:
    """``exc`` formatted as ``traceback.format_exception`` does (its chain of causes and
    contexts, exception groups), with at most ``frames`` frames per exception and without
    Python 3.11's caret lines (``^^^^``), which cost a ``compile()`` of the source line per
    frame: O(``frames``) per exception in the chain, whatever the depth of the stack."""
    import traceback

    summary = traceback.TracebackException(type(exc), exc, exc.__traceback__, limit=frames, lookup_lines=False)
    pending, seen = [summary], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        item.stack = traceback.StackSummary.from_list([(f.filename, f.lineno, f.name, f.line) for f in item.stack])
        pending.extend(e for e in (item.__cause__, item.__context__, *(getattr(item, "exceptions", None) or ())) if e is not None)
    return "".join(summary.format())


def record_exception(span: Any, exc: BaseException, *, capture_content: bool, limit: int) -> None:
    """The app's exception as an ``exception`` span event and an ERROR status.

    With ``capture_content`` the event has the type, message and stack trace (as the SDK's
    ``record_exception``, with unencodable characters replaced, at most
    :data:`STACKTRACE_FRAMES` frames per exception of the chain); without it only the type, and
    the status description is the type: an exception message may quote the user's text.
    """
    attributes: dict[str, Any] = {"exception.type": exception_type(exc)}
    description = attributes["exception.type"]
    if capture_content:
        message = clip(str(exc), limit)
        attributes["exception.message"] = message
        attributes["exception.stacktrace"] = clip(format_stacktrace(exc), limit * 4)
        description = f"{description}: {message}"
    span.add_event("exception", attributes)
    from opentelemetry.trace import Status as SpanStatus, StatusCode

    span.set_status(SpanStatus(StatusCode.ERROR, description))
