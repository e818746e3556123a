"""``@trace`` and ``instrument()``: one wrapt decorator for every kind of callable.

The kind of call is decided once, at decoration time: sync function, coroutine function,
generator function, or async generator function (classmethod/staticmethod objects are looked
through). wrapt keeps the signature, docstring, ``inspect`` flags and method binding. Around
the call:

* a span is started and made current, so the app's own child spans nest under it;
* the wrapped function is called exactly once, and its return value and exceptions pass
  through unchanged (an exception is recorded on the span, status ERROR, and re-raised as is);
* everything the tracer does sits in ``try/except Exception`` (see ``tracer.py``).

Streams: for generator functions the span starts at the first ``next()``; every chunk is
passed through unchanged (``send``/``throw``/``close`` are delegated), its text accumulated up
to the answer budget; the call is scored when the stream is exhausted or closed. A sync or async
function that *returns* a generator is treated the same way.
"""

from __future__ import annotations

import inspect
import logging
import types
import weakref
from typing import Any, Callable, Optional, TypeVar

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from . import tracer as _tracer
from .config import Settings
from .extraction import Extractor, Spec, chunk_text
from .tracer import EVALUATION_OVERRIDES, CallState, TraceOptions

logger = logging.getLogger("relevancy_tracer")

F = TypeVar("F", bound=Callable[..., Any])


def _get_tracer() -> Optional["_tracer.Tracer"]:
    tracer = _tracer._current
    if tracer is not None:
        return tracer if tracer.enabled else None
    try:
        tracer = _tracer.current()
    except Exception:
        logger.exception("relevancy-tracer: could not build the tracer; calls run untraced")
        return None
    return tracer if tracer.enabled else None


def _begin(options: TraceOptions) -> Optional[CallState]:
    tracer = _get_tracer()
    return tracer.begin(options) if tracer is not None else None


def _text_of(chunk: Any) -> str:
    try:
        return chunk_text(chunk)
    except Exception:
        return ""


# --------------------------------------------------------------------------------- streams


def _traced_generator(inner: Any, begin: Callable[[], Optional[CallState]], args: tuple, kwargs: dict, instance: Any) -> Any:
    """Delegates to ``inner`` (PEP 380 semantics: send, throw, close, return value) with the
    span current while the app's generator runs. ``begin()`` runs at the first ``next()``."""
    state = begin()
    ctx = None
    if state is not None:
        state.detach()
        if state.chunks is None:
            state.chunks = []
        ctx = otel_trace.set_span_in_context(state.span)
    to_send: Any = None
    to_throw: Optional[BaseException] = None
    while True:
        finished = False
        value: Any = None
        error: Optional[BaseException] = None
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            if to_throw is not None:
                thrown, to_throw = to_throw, None
                chunk = inner.throw(thrown)
            else:
                chunk = inner.send(to_send)
        except StopIteration as stop:
            finished, value = True, stop.value
        except BaseException as exc:  # raised by the app's generator
            error = exc
        finally:
            if token is not None:
                otel_context.detach(token)
        if finished:
            if state is not None:
                state.succeed(args, kwargs, value, instance)
            return value
        if error is not None:
            if state is not None:
                state.fail(error)
            raise error
        if state is not None:
            state.add_chunk(_text_of(chunk))
        try:
            to_send = yield chunk
        except GeneratorExit:
            token = otel_context.attach(ctx) if ctx is not None else None
            try:
                inner.close()
            except BaseException as exc:
                if state is not None:
                    state.fail(exc)
                raise
            finally:
                if token is not None:
                    otel_context.detach(token)
            if state is not None:
                state.succeed(args, kwargs, None, instance)  # closed early: score what was streamed
            raise
        except BaseException as exc:  # thrown in by the consumer: forward it
            to_throw = exc


async def _traced_async_generator(inner: Any, begin: Callable[[], Optional[CallState]], args: tuple, kwargs: dict, instance: Any) -> Any:
    """Async twin of :func:`_traced_generator` (``asend``/``athrow``/``aclose`` delegated)."""
    state = begin()
    ctx = None
    if state is not None:
        state.detach()
        if state.chunks is None:
            state.chunks = []
        ctx = otel_trace.set_span_in_context(state.span)
    to_send: Any = None
    to_throw: Optional[BaseException] = None
    while True:
        finished = False
        error: Optional[BaseException] = None
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            if to_throw is not None:
                thrown, to_throw = to_throw, None
                chunk = await inner.athrow(thrown)
            else:
                chunk = await inner.asend(to_send)
        except StopAsyncIteration:
            finished = True
        except BaseException as exc:
            error = exc
        finally:
            if token is not None:
                otel_context.detach(token)
        if finished:
            if state is not None:
                state.succeed(args, kwargs, None, instance)
            return
        if error is not None:
            if state is not None:
                state.fail(error)
            raise error
        if state is not None:
            state.add_chunk(_text_of(chunk))
        try:
            to_send = yield chunk
        except GeneratorExit:
            token = otel_context.attach(ctx) if ctx is not None else None
            try:
                await inner.aclose()
            except BaseException as exc:
                if state is not None:
                    state.fail(exc)
                raise
            finally:
                if token is not None:
                    otel_context.detach(token)
            if state is not None:
                state.succeed(args, kwargs, None, instance)
            raise
        except BaseException as exc:
            to_throw = exc


def _wrap_stream(result: Any, state: CallState, args: tuple, kwargs: dict, instance: Any) -> Any:
    """Wrap a generator returned by a plain function; its span already started with the call,
    so it is ended (status skipped) if the stream is collected without being consumed."""
    state.detach()
    traced = _traced_generator if isinstance(result, types.GeneratorType) else _traced_async_generator
    stream = traced(result, lambda: state, args, kwargs, instance)
    weakref.finalize(stream, state.abandon)
    return stream


# --------------------------------------------------------------------------------- wrappers


def _make_wrapper(kind: str, options: TraceOptions) -> Callable[..., Any]:
    if kind in ("generator", "async_generator"):
        traced = _traced_generator if kind == "generator" else _traced_async_generator

        def generator_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            inner = wrapped(*args, **kwargs)  # the app's generator object; its body has not run
            if _get_tracer() is None:
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
            return _finish(state, result, args, kwargs, instance)

        return async_wrapper

    def sync_wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = _begin(options)
        if state is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            state.fail(exc)
            raise
        return _finish(state, result, args, kwargs, instance)

    return sync_wrapper


def _finish(state: CallState, result: Any, args: tuple, kwargs: dict, instance: Any) -> Any:
    """After a normal return: wrap a returned stream, else hand the call to the tracer."""
    if isinstance(result, (types.GeneratorType, types.AsyncGeneratorType)):
        try:
            return _wrap_stream(result, state, args, kwargs, instance)
        except Exception:
            state.abandon()
            return result
    state.succeed(args, kwargs, result, instance)
    return result


def _kind_of(target: Any) -> str:
    if inspect.isasyncgenfunction(target):
        return "async_generator"
    if inspect.isgeneratorfunction(target):
        return "generator"
    if inspect.iscoroutinefunction(target):
        return "coroutine"
    return "sync"


def _decorate(fn: Any, question: Spec, answer: Spec, contexts: Spec, name: Optional[str], evaluation: dict) -> Any:
    unknown = set(evaluation) - set(EVALUATION_OVERRIDES)
    if unknown:
        raise TypeError(f"unknown trace option(s): {', '.join(sorted(unknown))}; evaluation settings allowed: {', '.join(EVALUATION_OVERRIDES)}")
    if evaluation:
        Settings(llm="openai", embeddings="openai").replace(**evaluation)  # validates: raises TypeError/ValueError
    target = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    if not callable(target):
        raise TypeError(f"@trace needs a callable, got {type(fn).__name__}")
    span_name = name or getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
    options = TraceOptions(span_name, Extractor(target, question, answer, contexts), dict(evaluation), bound=inspect.ismethod(fn))
    kind = _kind_of(inspect.unwrap(target) if not inspect.ismethod(target) else target)
    return wrapt.FunctionWrapper(fn, _make_wrapper(kind, options))


def trace(
    fn: Optional[F] = None,
    *,
    question: Spec = None,
    answer: Spec = None,
    contexts: Spec = None,
    name: Optional[str] = None,
    **evaluation: Any,
) -> Any:
    """Trace a RAG answer function and score its answers' relevancy in the background.

    Use as ``@trace`` or ``@trace(question=..., answer=..., contexts=..., name=...)`` on sync and
    async functions, methods, classmethods, staticmethods and (async) generators.

    Args:
        question, answer, contexts: where to find them: a parameter name, a dotted path
            (``"request.query"``, ``"return.answer"``), or ``fn(call: CallInfo) -> value``.
            Defaults: see :mod:`relevancy_tracer.extraction`.
        name: span name (default: the function's qualified name).
        **evaluation: per-function evaluation settings, e.g. ``method="decomposition"``,
            ``strictness=5`` (one of: method, strictness, noncommittal, generation, thresholds,
            combined_weights, temperature, max_answer_chars, max_question_chars, json_retries).

    Returns:
        The wrapped callable: same signature, docstring, return values and exceptions.

    Raises:
        TypeError, ValueError: at decoration time, for unknown options or bad values.
    """
    if fn is None:
        return lambda f: _decorate(f, question, answer, contexts, name, evaluation)
    return _decorate(fn, question, answer, contexts, name, evaluation)


def instrument(fn: F, **options: Any) -> F:
    """Trace a callable you do not own (a chain's ``invoke``, a client method).

    ``chain.invoke = relevancy_tracer.instrument(chain.invoke, question="input")`` returns a
    traced wrapper of ``fn``; options are those of :func:`trace`.
    """
    return trace(fn, **options)
