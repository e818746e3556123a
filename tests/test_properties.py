"""Property-based: for generated callables of every shape, decorating changes nothing.

Shapes: sync functions, coroutine functions, generator functions, async generator functions,
each plain, behind a ``functools.wraps`` wrapper, or as a bound method; returning a str, a dict,
an object, an iterator, a returned generator, or raising. For every shape the decorated and the
undecorated callable must return the very same objects (and yield the same chunks, with the same
generator return value), raise the very same exception object, and run the app's code exactly
as many times. The ``tracing`` fixture's span ledger then checks that every span ended exactly
once.
"""

from __future__ import annotations

import asyncio
import functools
import inspect

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import relevancy_tracer

QUESTION = "Where is France and what is its capital?"
ANSWER = "France is in western Europe and Paris is its capital."

KINDS = ("sync", "coroutine", "generator", "async_generator")
RESULTS = ("str", "dict", "object", "iterator", "returned_generator", "raise")
WRAPPERS = ("none", "wraps", "method")


class _Result:
    def __init__(self) -> None:
        self.answer = ANSWER


def _build(kind: str, outcome: str, wrapper: str, counter: list, payload: object, error: BaseException, traced: bool):
    """A fresh callable of the given shape (decorated when ``traced``: methods are decorated in
    the class body, as people write them); each call appends to ``counter``."""

    def value() -> object:
        counter.append(1)
        if outcome == "raise":
            raise error
        return payload

    if kind == "sync":

        def fn(question):
            return value()

    elif kind == "coroutine":

        async def fn(question):
            await asyncio.sleep(0)
            return value()

    elif kind == "generator":

        def fn(question):
            counter.append(1)
            yield "France is in western Europe "
            if outcome == "raise":
                raise error
            yield payload
            return payload

    else:

        async def fn(question):
            counter.append(1)
            yield "France is in western Europe "
            if outcome == "raise":
                raise error
            yield payload

    if wrapper == "wraps":
        inner = fn

        if kind in ("coroutine", "async_generator"):
            # a sync wrapper around async code, as people write them
            def wrapped(question):
                if kind == "coroutine":
                    return asyncio.run(inner(question))
                return inner(question)

        else:

            def wrapped(question):
                result = inner(question)
                return list(result) if kind == "generator" else result

        wrapper_fn = functools.wraps(inner)(wrapped)
        return relevancy_tracer.trace(wrapper_fn) if traced else wrapper_fn
    if wrapper == "method":
        function = fn

        if kind == "sync":

            def method(self, question):
                return function(question)

        elif kind == "coroutine":

            async def method(self, question):
                return await function(question)

        elif kind == "generator":

            def method(self, question):
                return (yield from function(question))

        else:

            async def method(self, question):
                async for chunk in function(question):
                    yield chunk

        holder = type("Holder", (), {"answer": relevancy_tracer.trace(method) if traced else method})()
        return holder.answer
    return relevancy_tracer.trace(fn) if traced else fn


def _call(fn, payload: object, error: BaseException):
    """Call and drain; the outcome with this run's payload and the app's error replaced by
    markers, so the runs of the plain and the traced callable compare position by position:
    ("ok" | "raised", value, chunks)."""

    def mark(value: object) -> object:
        if value is payload:
            return "<the payload object>"
        if value is error:
            return "<the app's error object>"
        if type(value) in (list, tuple):  # e.g. a wrapper's list(generator)
            return type(value)(mark(item) for item in value)
        return value

    chunks: list = []
    try:
        result = fn(QUESTION)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        if inspect.isasyncgen(result):

            async def drain():
                async for chunk in result:
                    chunks.append(mark(chunk))

            asyncio.run(drain())
            return "ok", "<drained async generator>", chunks
        if inspect.isgenerator(result) and result is not payload:  # the app's stream: keep its return value
            while True:
                try:
                    chunks.append(mark(next(result)))
                except StopIteration as stop:
                    return "ok", mark(stop.value), chunks
        return "ok", mark(result), chunks
    except Exception as exc:  # noqa: BLE001 - the app's exception, compared below
        return "raised", mark(exc) if exc is error else (type(exc), str(exc)), chunks


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), outcome=st.sampled_from(RESULTS), wrapper=st.sampled_from(WRAPPERS), ratio=st.sampled_from([0.0, 1.0]))
def test_decorating_changes_nothing(tracing, otel, kind, outcome, wrapper, ratio):
    tracing(sample_ratio=ratio)

    def make_payload() -> object:
        return {
            "str": ANSWER,
            "dict": {"answer": ANSWER, "contexts": ["Paris is the capital of France."]},
            "object": _Result(),
            "iterator": iter([ANSWER]),
            "returned_generator": (piece for piece in [ANSWER]),
            "raise": None,
        }[outcome]

    error = ValueError("the app failed", 7)
    plain_count: list = []
    traced_count: list = []
    plain_payload, traced_payload = make_payload(), make_payload()
    plain = _build(kind, outcome, wrapper, plain_count, plain_payload, error, traced=False)
    traced = _build(kind, outcome, wrapper, traced_count, traced_payload, error, traced=True)
    try:
        expected = _call(plain, plain_payload, error)
        got = _call(traced, traced_payload, error)
        assert got == expected
        assert len(traced_count) == len(plain_count)
        assert relevancy_tracer.flush(10)
        import gc

        gc.collect()
        otel.ledger.check()
    finally:
        # hypothesis reseeds `random`, which the SDK's id generator uses, so span ids repeat
        # across examples: the ledger is checked and cleared per example
        otel.ledger.clear()
