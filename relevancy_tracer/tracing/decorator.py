"""``@trace`` and ``instrument()``: one wrapt decorator for every kind of callable.

The kind of call is decided once, at decoration time, from the callable actually wrapped (not
from what ``inspect.unwrap`` finds behind a ``functools.wraps`` wrapper): a sync function,
coroutine function, generator function or async generator function (classmethod and
staticmethod objects are looked through to the function they hold). wrapt keeps the
signature, docstring, ``inspect`` flags and method binding. Around the call:

* a span is started and made current, so the app's own child spans nest under it;
* the wrapped function is called exactly once; its return value is passed back as the very same
  object, and its exceptions propagate unchanged (same object, args and traceback);
* everything the tracer does sits in ``try/except Exception`` (see :mod:`.call`).

What is never touched: a sync function that returns an awaitable, or a sync or async function
that returns an iterator or generator, gets its return value back untouched (the call is not
scored, status ``skipped``), unless the decoration opts in with ``stream=True``, which wraps a
returned (async) generator as below.

Streams: for generator functions the span starts at the first ``next()``; every chunk is passed
through unchanged (``send``/``throw``/``close`` are delegated, PEP 380), its text accumulated up
to the answer budget; the call is scored when the stream is exhausted. A stream closed before
its end (a client disconnect) gets status ``incomplete`` and is not scored unless
``score_incomplete_streams`` is set.
"""

from __future__ import annotations

import collections.abc
import inspect
import logging
import types
import weakref
from typing import Any, Callable, Optional, TypeVar

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from . import lifecycle
from ..config import EVALUATION_OVERRIDES, Settings
from .call import CallState, TraceOptions
from .extraction import Extractor, Spec, chunk_text

logger = logging.getLogger("relevancy_tracer")

F = TypeVar("F", bound=Callable[..., Any])


def _runtime() -> Any:
    try:
        runtime = lifecycle.current()
    except Exception:
        logger.exception("relevancy-tracer: could not build the tracer; calls run untraced")
        return None
    return runtime if runtime is not None and runtime.enabled else None


def _begin(options: TraceOptions) -> Optional[CallState]:
    runtime = _runtime()
    return CallState.begin(runtime, options) if runtime is not None else None


def _text_of(chunk: Any) -> str:
    try:
        return chunk_text(chunk)
    except Exception:
        return ""


# --------------------------------------------------------------------------------- streams


class _Stream:
    """What a traced (async) generator does around the app's generator, written once for both.

    ``with stream:`` wraps each resumption of the app's generator (``send``/``throw`` or their
    async forms) and its closing: the call's span is current inside; on leaving, the end of the
    stream (``StopIteration`` / ``StopAsyncIteration``, suppressed) scores the call, and any
    other exception ends the span as failed and propagates unchanged.
    """

    __slots__ = ("state", "ctx", "args", "kwargs", "instance", "stop", "ended", "value", "sent", "thrown", "_token")

    def __init__(self, state: Optional[CallState], args: tuple, kwargs: dict, instance: Any, stop: type):
        self.state = state
        self.ctx = None
        if state is not None:
            state.detach()
            if state.chunks is None:
                state.chunks = []
            self.ctx = otel_trace.set_span_in_context(state.span)
        self.args, self.kwargs, self.instance, self.stop = args, kwargs, instance, stop
        self.ended = False
        self.value: Any = None  # the generator's return value
        self.sent: Any = None  # what the consumer sent in at the last yield
        self.thrown: Optional[BaseException] = None  # what the consumer threw in, to forward
        self._token: Any = None

    def resume(self, send: Callable[[Any], Any], throw: Callable[[BaseException], Any]) -> Any:
        """Forward what the consumer did at the last yield: ``throw(exc)`` or ``send(value)``."""
        thrown, self.thrown = self.thrown, None
        return throw(thrown) if thrown is not None else send(self.sent)

    def chunk(self, chunk: Any) -> Any:
        """Accumulate a chunk's text (up to the answer budget); returns the chunk unchanged."""
        if self.state is not None:
            self.state.add_chunk(_text_of(chunk))
        return chunk

    def closed(self) -> None:
        """The app's generator was closed before its end (a client disconnect)."""
        if self.state is not None:
            self.state.incomplete(self.args, self.kwargs, self.instance)

    def __enter__(self) -> "_Stream":
        self._token = otel_context.attach(self.ctx) if self.ctx is not None else None
        return self

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> bool:
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        if kind is None:
            return False
        if issubclass(kind, self.stop):  # the stream's end
            self.ended = True
            self.value = getattr(exc, "value", None)  # StopAsyncIteration carries none
            if self.state is not None:
                self.state.succeed(self.args, self.kwargs, self.value, self.instance)
            return True
        if self.state is not None:  # raised by the app's generator: propagates unchanged
            self.state.fail(exc)
        return False


def _traced_generator(inner: Any, begin: Callable[[], Optional[CallState]], args: tuple, kwargs: dict, instance: Any) -> Any:
    """Delegates to ``inner`` (PEP 380 semantics: send, throw, close, return value) with the
    span current while the app's generator runs. ``begin()`` runs at the first ``next()``."""
    stream = _Stream(begin(), args, kwargs, instance, StopIteration)
    while True:
        with stream:
            chunk = stream.resume(inner.send, inner.throw)
        if stream.ended:
            return stream.value
        try:
            stream.sent = yield stream.chunk(chunk)
        except GeneratorExit:  # the consumer closed the stream
            with stream:
                inner.close()
            stream.closed()
            raise
        except BaseException as exc:  # thrown in by the consumer: forwarded at the next resume
            stream.thrown = exc


async def _traced_async_generator(inner: Any, begin: Callable[[], Optional[CallState]], args: tuple, kwargs: dict, instance: Any) -> Any:
    """:func:`_traced_generator` for async generators (``asend``/``athrow``/``aclose``)."""
    stream = _Stream(begin(), args, kwargs, instance, StopAsyncIteration)
    while True:
        with stream:
            chunk = await stream.resume(inner.asend, inner.athrow)
        if stream.ended:
            return
        try:
            stream.sent = yield stream.chunk(chunk)
        except GeneratorExit:  # the consumer closed the stream
            with stream:
                await inner.aclose()
            stream.closed()
            raise
        except BaseException as exc:  # thrown in by the consumer: forwarded at the next resume
            stream.thrown = exc


def _wrap_stream(result: Any, state: CallState, args: tuple, kwargs: dict, instance: Any) -> Any:
    """Wrap a generator returned by a plain function (``stream=True``); its span already started
    with the call, so it is ended (status skipped) if the stream is collected unconsumed."""
    state.detach()
    traced = _traced_generator if isinstance(result, types.GeneratorType) else _traced_async_generator
    stream = traced(result, lambda: state, args, kwargs, instance)
    weakref.finalize(stream, state.abandon)
    return stream


def _untouchable(result: Any, awaitables: bool) -> Optional[str]:
    """Why a return value must be passed through unread, or None when it may be read."""
    if awaitables and inspect.isawaitable(result):
        return "awaitable_returned"
    if isinstance(result, (collections.abc.Iterator, collections.abc.AsyncIterator)):
        return "iterator_returned"
    return None


#: Return types that are neither awaitables, iterators nor generators (checked by type first:
#: the ABC checks of :func:`_untouchable` cost more than the rest of an unsampled call's logic).
_PLAIN_RESULTS = frozenset({str, dict, list, tuple, int, float, bool, bytes, type(None)})


def _finish(state: CallState, result: Any, args: tuple, kwargs: dict, instance: Any, awaitables: bool) -> Any:
    """After a normal return: hand the call to the tracer, and return ``result`` itself (or, for
    ``stream=True`` and a returned generator, the delegating stream)."""
    try:
        if type(result) in _PLAIN_RESULTS:
            state.succeed(args, kwargs, result, instance)
            return result
        if state.options.stream and isinstance(result, (types.GeneratorType, types.AsyncGeneratorType)):
            try:
                return _wrap_stream(result, state, args, kwargs, instance)
            except Exception:
                state.abandon()
                return result
        reason = _untouchable(result, awaitables)
        if reason is not None:
            state.skip(reason)
        else:
            state.succeed(args, kwargs, result, instance)
    except Exception:  # pragma: no cover - CallState never raises; belt and braces
        logger.exception("relevancy-tracer: finishing a call failed")
    return result


# --------------------------------------------------------------------------------- wrappers


def _make_wrapper(kind: str, options: TraceOptions) -> Callable[..., Any]:
    if kind in ("generator", "async_generator"):
        traced = _traced_generator if kind == "generator" else _traced_async_generator

        def generator_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            inner = wrapped(*args, **kwargs)  # the app's generator object; its body has not run
            if _runtime() is None:
                return inner
            return traced(inner, lambda: _begin(options), args, kwargs, instance)  # span starts at first next()

        return generator_wrapper

    if kind == "coroutine":

        async def async_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            state = _begin(options)
            if state is None:
                return await wrapped(*args, **kwargs)
            try:
                result = await wrapped(*args, **kwargs)
            except BaseException as exc:
                state.fail(exc)
                raise
            return _finish(state, result, args, kwargs, instance, awaitables=False)

        return async_wrapper

    def sync_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        runtime = _runtime()  # _begin(options), inlined: this is every traced call's path
        state = CallState.begin(runtime, options) if runtime is not None else None
        if state is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            state.fail(exc)
            raise
        return _finish(state, result, args, kwargs, instance, awaitables=True)

    return sync_wrapper


def kind_of(target: Any) -> str:
    """``sync``, ``coroutine``, ``generator`` or ``async_generator``: the kind of ``target``
    itself (a ``functools.wraps`` wrapper is the kind of the wrapper, not of what it wraps)."""
    function = getattr(target, "__func__", target)  # bound methods
    code = getattr(function, "__code__", None)
    if code is not None:
        flags = code.co_flags
        if flags & inspect.CO_ASYNC_GENERATOR:
            return "async_generator"
        if flags & inspect.CO_GENERATOR:
            return "generator"
        if flags & inspect.CO_COROUTINE:
            return "coroutine"
        return "sync"
    # other callables (builtins, partials, objects with __call__): ask inspect, without unwrapping
    call = getattr(type(target), "__call__", None) if not isinstance(target, (types.BuiltinFunctionType, types.MethodWrapperType)) else None
    for candidate in (target, getattr(target, "func", None), call):
        if candidate is None:
            continue
        if inspect.isasyncgenfunction(candidate):
            return "async_generator"
        if inspect.isgeneratorfunction(candidate):
            return "generator"
        if inspect.iscoroutinefunction(candidate):
            return "coroutine"
    return "sync"


def _decorate(fn: Any, question: Spec, answer: Spec, contexts: Spec, name: Optional[str], stream: bool, evaluation: dict, history: Spec = None) -> Any:
    unknown = set(evaluation) - set(EVALUATION_OVERRIDES)
    if unknown:
        raise TypeError(f"unknown trace option(s): {', '.join(sorted(unknown))}; evaluation settings allowed: {', '.join(EVALUATION_OVERRIDES)}")
    if evaluation:
        Settings(llm="openai", embeddings="openai").replace(**evaluation)  # validates: raises TypeError/ValueError
    target = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if not callable(target):
        raise TypeError(f"@trace needs a callable, got {type(fn).__name__}")
    span_name = name or getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    options = TraceOptions(span_name, Extractor(target, question, answer, contexts, history), dict(evaluation), bound=inspect.ismethod(fn), stream=stream)
    return wrapt.FunctionWrapper(fn, _make_wrapper(kind_of(target), options))


def trace(
    fn: Optional[F] = None,
    *,
    question: Spec = None,
    answer: Spec = None,
    contexts: Spec = None,
    history: Spec = None,
    name: Optional[str] = None,
    stream: bool = False,
    **evaluation: Any,
) -> Any:
    """Trace a RAG answer function and score its answers' relevancy in the background.

    Use as ``@trace`` or ``@trace(question=..., answer=..., contexts=..., name=...)`` on sync and
    async functions, methods, classmethods, staticmethods and (async) generator functions.

    Args:
        question, answer, contexts: where to find them: a parameter name, a dotted path
            (``"request.query"``, ``"return.answer"``), or ``fn(call: CallInfo) -> value``.
            Defaults: see :mod:`relevancy_tracer.tracing.extraction`.
        history: where the conversation's earlier turns are (a list of chat messages), the same
            way; default: a ``history`` / ``chat_history`` parameter, or the messages before the
            last user message of a ``messages`` parameter. With turns, the answer is judged
            against the last turn in its conversation (see :meth:`Engine.ascore`).
        name: span name (default: the function's qualified name).
        stream: also wrap (async) generators *returned* by a plain function and score the joined
            chunks (default False: a returned iterator is passed back untouched, not scored).
        **evaluation: per-function evaluation settings, e.g. ``method="decomposition"``,
            ``strictness=5`` (one of: method, strictness, noncommittal, generation, thresholds,
            combined_weights, temperature, max_answer_chars, max_question_chars, json_retries,
            calibration).

    Returns:
        The wrapped callable: same signature, docstring, return values and exceptions.

    Raises:
        TypeError, ValueError: at decoration time, for unknown options or bad values.
    """
    if fn is None:
        return lambda f: _decorate(f, question, answer, contexts, name, stream, evaluation, history)
    return _decorate(fn, question, answer, contexts, name, stream, evaluation, history)


def instrument(fn: F, **options: Any) -> F:
    """Trace a callable you do not own (a chain's ``invoke``, a client method).

    ``chain.invoke = relevancy_tracer.instrument(chain.invoke, question="input")`` returns a
    traced wrapper of ``fn``; options are those of :func:`trace`.
    """
    return trace(fn, **options)
