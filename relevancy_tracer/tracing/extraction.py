"""Finding the question, the answer and the contexts of a traced call.

Each of ``question``, ``answer``, ``contexts`` may be given as:

* a parameter name (``"query"``) or a dotted path into a parameter (``"request.query"``,
  ``"payload.messages.0.content"``);
* a path into the return value (``"return"``, ``"return.answer"``, ``"return.docs"``);
* a callable ``fn(call: CallInfo) -> value``.

Defaults: question = the parameter named question | query | user_input | prompt, else the first
``str`` argument, else the last user message of a ``messages`` parameter (an OpenAI-style chat
list, LangChain or LlamaIndex messages); answer = a ``str`` return value, else the return value's
answer | response | output | result key or attribute; contexts = a parameter or return field
named contexts | documents | retrieved_contexts | docs; history (the conversation's earlier
turns) = a parameter named history | chat_history | messages holding a list of chat messages
(with ``messages``, the turns before its last user message), without the question itself when
the list ends with it.

Extraction never changes what the app sees:

* it never iterates anything but a ``list`` or ``tuple`` (a generator of documents returned to
  the caller stays unconsumed), and contexts are only taken from lists or tuples of ``str``, of
  dicts with a ``str`` page_content | content | text, or of objects holding such an attribute
  as plain data;
* it never runs the app's code: attributes are read with ``inspect.getattr_static``, so
  properties, ``__getattr__`` and descriptors are not invoked (a LangChain ``Document`` or a
  pydantic model keeps its fields as plain data and is read as usual);
* contexts are capped (:func:`cap_contexts`): at most ``max_contexts`` of them and
  ``max_context_chars`` characters in all.

Parameter positions are computed once, at decoration time, so extraction on the hot path is a
few dict and tuple lookups. Failures raise :class:`ExtractionError`, which the tracer records
on the span; they never reach the app.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from ..dataset.columns import resolve_path
from ..scoring import conversation

Spec = Union[str, Callable[["CallInfo"], Any], None]

QUESTION_NAMES = ("question", "query", "user_input", "prompt")
ANSWER_KEYS = ("answer", "response", "output", "result")
CONTEXT_NAMES = ("contexts", "documents", "retrieved_contexts", "docs")
HISTORY_NAMES = ("history", "chat_history")
MESSAGES_NAME = "messages"
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

    def __init__(self, fn: Callable, question: Spec = None, answer: Spec = None, contexts: Spec = None, history: Spec = None):
        self.question_spec, self.answer_spec, self.contexts_spec, self.history_spec = question, answer, contexts, history
        target = getattr(fn, "__func__", fn)
        try:
            params = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):
            params = []
        self._positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        self._first_is_self = bool(self._positional) and self._positional[0] in ("self", "cls")
        for spec in (question, answer, contexts, history):
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
            last = self._from_messages(call)
            if last is not None:
                return last[0]
            raise ExtractionError("question: no parameter named question/query/user_input/prompt, no str argument and no messages list with a user message")
        return _text(self._resolve(spec, call, "question"), "question")

    def _from_messages(self, call: CallInfo, max_turns: int = 8, max_chars: int = 6000) -> Optional[tuple[str, "conversation.History"]]:
        messages = call.arguments.get(MESSAGES_NAME)
        if messages is None:
            return None
        return conversation.split_last_question(messages, max_turns, max_chars)

    def history(self, call: CallInfo, question: str, max_turns: int, max_chars: int) -> "conversation.History":
        """The conversation's earlier turns of the call (empty without any; ``invalid`` set
        for a history of no known shape, which is judged as single-turn). Bounded by
        ``max_turns`` and ``max_chars`` (:func:`~relevancy_tracer.scoring.conversation.read_history`:
        only the last few dozen items of a list are looked at); never raises."""
        spec = self.history_spec
        try:
            if spec is None:
                for name in HISTORY_NAMES:
                    if name in call.arguments and call.arguments[name] is not None:
                        past = conversation.read_history(call.arguments[name], max_turns, max_chars)
                        break
                else:
                    last = self._from_messages(call, max_turns, max_chars)
                    if last is None:
                        return conversation.History()
                    past = last[1]
            else:
                past = conversation.read_history(self._resolve(spec, call, "history"), max_turns, max_chars)
        except (conversation.HistoryError, ExtractionError, RecursionError):
            return conversation.History(invalid=True)
        return conversation.without_question(past, question)

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
    """``obj[key]`` for dicts, else the attribute ``key`` when it is plain data (an instance
    ``__dict__`` entry, a ``__slots__`` value or a class constant): no property, descriptor or
    ``__getattr__`` of the app's runs."""
    if isinstance(obj, dict):
        return obj.get(key, _MISSING)
    if isinstance(obj, _NO_FIELDS):
        return _MISSING
    try:
        value = inspect.getattr_static(obj, key)
    except AttributeError:
        return _MISSING
    if isinstance(value, types.MemberDescriptorType):  # a __slots__ value: reading it runs no app code
        try:
            return value.__get__(obj, type(obj))
        except AttributeError:
            return _MISSING
    if hasattr(type(value), "__get__"):  # a property, function or other descriptor: it would run code
        return _MISSING
    return value


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
    """Context documents as texts, from a str, a dict, or a list or tuple of str items, dicts
    or objects with a str page_content | content | text. Anything else (a generator, a custom
    iterable) is left alone: None. Never iterates anything but lists and tuples."""
    if value is None:
        return None
    if isinstance(value, (str, dict)):
        items: Sequence[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    texts = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            continue
        for key in DOCUMENT_TEXT_KEYS:
            text = _lookup(item, key)
            if isinstance(text, str):
                texts.append(text)
                break
    return texts


def cap_contexts(contexts: Optional[list[str]], max_count: int, max_chars: int) -> Optional[list[str]]:
    """At most ``max_count`` contexts and ``max_chars`` characters in all (the last one kept
    is cut): a call with a thousand retrieved documents costs bounded memory and attributes."""
    if not contexts:
        return contexts
    kept: list[str] = []
    budget = max_chars
    for text in contexts[:max_count]:
        if budget <= 0:
            break
        kept.append(text[:budget])
        budget -= len(kept[-1])
    return kept


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
