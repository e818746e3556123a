"""Finding the question, the answer and the contexts of a traced call.

Each of ``question``, ``answer``, ``contexts`` may be given as:

* a parameter name (``"query"``) or a dotted path into a parameter (``"request.query"``,
  ``"payload.messages.0.content"``);
* a path into the return value (``"return"``, ``"return.answer"``, ``"return.docs"``);
* a callable ``fn(call: CallInfo) -> value``.

Defaults: question = the parameter named question | query | user_input | prompt, else the first
``str`` argument; answer = a ``str`` return value, else the return value's
answer | response | output | result key or attribute; contexts = a parameter or return field
named contexts | documents | retrieved_contexts | docs (documents may be str, or objects or
dicts with page_content | content | text).

Parameter positions are computed once, at decoration time, so extraction on the hot path is a
few dict and tuple lookups. Failures raise :class:`ExtractionError`, which the tracer records
on the span; they never reach the app.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from .dataset import resolve_path

Spec = Union[str, Callable[["CallInfo"], Any], None]

QUESTION_NAMES = ("question", "query", "user_input", "prompt")
ANSWER_KEYS = ("answer", "response", "output", "result")
CONTEXT_NAMES = ("contexts", "documents", "retrieved_contexts", "docs")
DOCUMENT_TEXT_KEYS = ("page_content", "content", "text")
CHUNK_TEXT_KEYS = ("answer", "content", "delta", "text", "response", "output")


class ExtractionError(Exception):
    """The question, answer or contexts could not be found or are not text."""


@dataclass
class CallInfo:
    """One traced call, as extraction callables see it.

    Attributes:
        args, kwargs: the arguments as passed (without ``self``/``cls``).
        arguments: arguments by parameter name (positional ones included).
        result: the return value (for streams: the joined text).
        instance: the bound instance or class, if any.
    """

    args: tuple
    kwargs: dict
    arguments: dict = field(default_factory=dict)
    result: Any = None
    instance: Any = None


class Extractor:
    """Extraction rules of one decorated callable (built once per decoration)."""

    def __init__(self, fn: Callable, question: Spec = None, answer: Spec = None, contexts: Spec = None):
        self.question_spec, self.answer_spec, self.contexts_spec = question, answer, contexts
        target = getattr(fn, "__func__", fn)
        try:
            params = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):
            params = []
        self._positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        self._first_is_self = bool(self._positional) and self._positional[0] in ("self", "cls")
        for spec in (question, answer, contexts):
            if spec is not None and not (callable(spec) or (isinstance(spec, str) and spec)):
                raise TypeError(f"an extraction spec must be a non-empty str or a callable, got {spec!r}")

    # -------------------------------------------------------------- call binding

    def arguments(self, args: tuple, kwargs: dict, bound: bool) -> dict:
        """Arguments by name. ``bound``: args exclude the first parameter (self/cls)."""
        names = self._positional[1:] if (bound and self._first_is_self) else self._positional
        arguments = dict(self._defaults)
        arguments.update(zip(names, args))
        arguments.update(kwargs)
        return arguments

    # -------------------------------------------------------------- the three fields

    def question(self, call: CallInfo) -> str:
        spec = self.question_spec
        if spec is None:
            for name in QUESTION_NAMES:
                if name in call.arguments:
                    return _text(call.arguments[name], "question")
            for value in list(call.args) + list(call.kwargs.values()):
                if isinstance(value, str):
                    return value
            raise ExtractionError("question: no parameter named question/query/user_input/prompt and no str argument")
        return _text(self._resolve(spec, call, "question"), "question")

    def answer(self, call: CallInfo) -> str:
        spec = self.answer_spec
        if spec is None:
            return default_answer(call.result)
        return _text(self._resolve(spec, call, "answer"), "answer")

    def contexts(self, call: CallInfo) -> Optional[list[str]]:
        spec = self.contexts_spec
        if spec is None:
            for name in CONTEXT_NAMES:
                if name in call.arguments:
                    return documents(call.arguments[name])
            if isinstance(call.result, _NO_FIELDS):  # the usual str answer: _lookup would miss every name
                return None
            for name in CONTEXT_NAMES:
                value = _lookup(call.result, name)
                if value is not _MISSING:
                    return documents(value)
            return None
        return documents(self._resolve(spec, call, "contexts"))

    def _resolve(self, spec: Spec, call: CallInfo, what: str) -> Any:
        if callable(spec):
            try:
                return spec(call)
            except Exception as exc:
                raise ExtractionError(f"{what}: the extraction callable raised {type(exc).__name__}: {exc}") from exc
        assert isinstance(spec, str)
        head, _, rest = spec.partition(".")
        if head == "return":
            root = call.result
        elif head in call.arguments:
            root = call.arguments[head]
        else:
            raise ExtractionError(f"{what}: no parameter named {head!r}")
        if not rest:
            return root
        try:
            return resolve_path(root, rest)
        except KeyError as exc:
            raise ExtractionError(f"{what}: {spec!r} not found") from exc


_MISSING = object()


#: Types :func:`_lookup` finds no key or attribute in (besides None).
_NO_FIELDS = (str, bytes, int, float, list, tuple, type(None))


def _lookup(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, _MISSING)
    if isinstance(obj, _NO_FIELDS):
        return _MISSING
    return getattr(obj, key, _MISSING)


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    raise ExtractionError(f"{what}: expected str, got {type(value).__name__}")


def default_answer(result: Any) -> str:
    """A str return value, else its answer | response | output | result key or attribute."""
    if isinstance(result, str):
        return result
    for key in ANSWER_KEYS:
        value = _lookup(result, key)
        if isinstance(value, str):
            return value
    raise ExtractionError(f"answer: the return value ({type(result).__name__}) is not a str and has no str answer/response/output/result")


def documents(value: Any) -> Optional[list[str]]:
    """Context documents as texts: str items, or page_content/content/text of dicts or objects."""
    if value is None:
        return None
    items: Sequence[Any] = [value] if isinstance(value, (str, dict)) else value
    texts = []
    try:
        for item in items:
            if isinstance(item, str):
                texts.append(item)
                continue
            for key in DOCUMENT_TEXT_KEYS:
                text = _lookup(item, key)
                if isinstance(text, str):
                    texts.append(text)
                    break
            else:
                texts.append(str(item))
    except TypeError as exc:
        raise ExtractionError(f"contexts: expected a list of documents, got {type(value).__name__}") from exc
    return texts


def chunk_text(chunk: Any) -> str:
    """The text of one streamed chunk: a str, a dict's answer/content/delta/text, an object's
    ``content``/``text``, or an OpenAI chat chunk's ``choices[0].delta.content``."""
    if isinstance(chunk, str):
        return chunk
    if isinstance(chunk, bytes):
        return chunk.decode("utf-8", errors="replace")
    for key in CHUNK_TEXT_KEYS:
        value = _lookup(chunk, key)
        if isinstance(value, str):
            return value
        if key == "delta" and value is not _MISSING:
            inner = _lookup(value, "content")
            if isinstance(inner, str):
                return inner
    choices = _lookup(chunk, "choices")
    if isinstance(choices, (list, tuple)) and choices:
        delta = _lookup(choices[0], "delta")
        content = _lookup(delta, "content") if delta is not _MISSING else _MISSING
        if isinstance(content, str):
            return content
    return ""
