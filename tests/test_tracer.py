"""The decorator and tracer with the SDK's in-memory exporter and a real HTTP model server."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import threading

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode

import relevancy_tracer
from relevancy_tracer import CallInfo
from relevancy_tracer.otel import attributes as A
from relevancy_tracer.otel.results import evaluation_id
from relevancy_tracer_testing import Gate, Hang

from .conftest import finished_spans

QUESTION = "Where is France and what is its capital?"
ANSWER = "France is in western Europe and Paris is its capital."


def attrs_of(span):
    return dict(span.attributes or {})


def only_span(otel, name):
    spans = finished_spans(otel, name)
    assert len(spans) == 1, [s.name for s in finished_spans(otel)]
    return spans[0]


def test_sync_function_span_carries_the_result(tracing, otel, server):
    calls = []

    @relevancy_tracer.trace
    def answer(question: str) -> str:
        """Answer a question."""
        calls.append(question)
        return ANSWER

    with otel.tracer.start_as_current_span("request") as parent:
        before = time.time_ns()
        result = answer(QUESTION)
        returned = time.time_ns()
    assert result == ANSWER and calls == [QUESTION]
    assert relevancy_tracer.flush(10)
    span = only_span(otel, "test_sync_function_span_carries_the_result.<locals>.answer")
    a = attrs_of(span)
    assert span.kind == SpanKind.INTERNAL and span.parent.span_id == parent.get_span_context().span_id
    assert before <= span.end_time <= returned  # ended with the time the call returned, not when scored
    assert a[A.OPENINFERENCE_SPAN_KIND] == "CHAIN" and a[A.INPUT_VALUE] == QUESTION and a[A.OUTPUT_VALUE] == ANSWER
    assert a[A.STATUS] == "scored" and 0.0 < a[A.SCORE] <= 1.0
    assert len(a[A.GENERATED_QUESTIONS]) == 3 and len(a[A.SIMILARITIES]) == 3 and len(a[A.NONCOMMITTAL]) == 3
    assert a[A.STRICTNESS] == 3 and a[A.LLM_MODEL] == "fake-chat" and a[A.EMBEDDING_MODEL] == "fake-embed"
    assert a[A.LATENCY_MS] > 0 and a[A.INPUT_TOKENS] > 0 and a[A.OUTPUT_TOKENS] > 0 and a[A.LABEL] and a[A.EXPLANATION]
    (event,) = [e for e in span.events if e.name == A.GEN_AI_EVALUATION_RESULT]
    assert event.attributes[A.GEN_AI_EVALUATION_NAME] == "answer_relevancy"
    assert event.attributes[A.GEN_AI_EVALUATION_SCORE_VALUE] == a[A.SCORE]
    assert event.attributes[A.GEN_AI_EVALUATION_SCORE_LABEL] == a[A.LABEL]
    assert event.attributes[A.GEN_AI_EVALUATION_EXPLANATION] == a[A.EXPLANATION]
    # the id the service and the Phoenix annotation use for the same span and method
    expected_id = evaluation_id(format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"), a[A.METHOD])
    assert a[A.EVALUATION_ID] == event.attributes[A.EVALUATION_ID] == expected_id
    assert event.attributes[A.EVALUATOR_VERSION] == a[A.EVALUATOR_VERSION]
    assert server.requests_to("embeddings")[0]["input"][0] == QUESTION


def test_signature_docstring_and_return_value_are_the_apps(tracing):
    sentinel = {"answer": ANSWER, "extra": object()}

    def original(question: str, *, k: int = 3) -> dict:
        """Original docstring."""
        return sentinel

    traced = relevancy_tracer.trace(original)
    assert traced(QUESTION) is sentinel
    assert inspect.signature(traced) == inspect.signature(original)
    assert traced.__doc__ == "Original docstring." and traced.__name__ == "original" and traced.__wrapped__ is original


def test_exception_is_recorded_and_reraised_unchanged(tracing, otel, server):
    error = ValueError("boom")
    calls = []

    @relevancy_tracer.trace
    def answer(question):
        calls.append(1)
        raise error

    with pytest.raises(ValueError) as info:
        answer(QUESTION)
    assert info.value is error and calls == [1]
    relevancy_tracer.flush(5)
    span = only_span(otel, "test_exception_is_recorded_and_reraised_unchanged.<locals>.answer")
    assert span.status.status_code == StatusCode.ERROR and "boom" in span.status.description
    assert [e.name for e in span.events] == ["exception"] and attrs_of(span)[A.STATUS] == "skipped"
    assert server.requests == []


def test_async_function_and_dict_return_with_contexts(tracing, otel):
    @relevancy_tracer.trace
    async def answer(query: str, top_k: int = 2) -> dict:
        return {"answer": ANSWER, "documents": [{"page_content": "France is in Europe."}, "Paris is the capital."]}

    assert inspect.iscoroutinefunction(answer)
    result = asyncio.run(answer(QUESTION))
    assert result["answer"] == ANSWER
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "test_async_function_and_dict_return_with_contexts.<locals>.answer"))
    assert a[A.INPUT_VALUE] == QUESTION and a[A.OUTPUT_VALUE] == ANSWER and a[A.STATUS] == "scored"
    assert a["retrieval.documents.0.document.content"] == "France is in Europe."
    assert a["retrieval.documents.1.document.content"] == "Paris is the capital."


class Bot:
    prefix = "Bot"

    @relevancy_tracer.trace
    def ask(self, prompt: str) -> str:
        return f"{self.prefix}: {ANSWER}"

    @relevancy_tracer.trace
    @classmethod
    def ask_class(cls, question: str) -> str:
        return f"{cls.prefix}: {ANSWER}"

    @classmethod
    @relevancy_tracer.trace
    def ask_class_inner(cls, question: str) -> str:
        return f"{cls.prefix}: {ANSWER}"

    @relevancy_tracer.trace
    @staticmethod
    def ask_static(question: str) -> str:
        return ANSWER

    @relevancy_tracer.trace(question="q.text")
    async def ask_async(self, q) -> str:
        return ANSWER


def test_methods_classmethods_staticmethods(tracing, otel):
    class Q:
        text = QUESTION

    bot = Bot()
    assert bot.ask(QUESTION).startswith("Bot:")
    assert Bot.ask_class(QUESTION).startswith("Bot:") and bot.ask_class(QUESTION).startswith("Bot:")
    assert Bot.ask_class_inner(QUESTION).startswith("Bot:")
    assert Bot.ask_static(QUESTION) == ANSWER and bot.ask_static(QUESTION) == ANSWER
    assert asyncio.run(bot.ask_async(Q())) == ANSWER
    assert relevancy_tracer.flush(10)
    spans = finished_spans(otel)
    names = sorted(s.name for s in spans)
    assert names == sorted(["Bot.ask", "Bot.ask_class", "Bot.ask_class", "Bot.ask_class_inner", "Bot.ask_static", "Bot.ask_static", "Bot.ask_async"])
    for span in spans:
        a = attrs_of(span)
        assert a[A.STATUS] == "scored" and a[A.INPUT_VALUE] == QUESTION, (span.name, a)


def test_generator_stream_is_joined_and_send_is_delegated(tracing, otel):
    received = []

    @relevancy_tracer.trace
    def stream(question: str):
        reply = yield "France is in western Europe "
        received.append(reply)
        yield "and Paris is its capital."
        return "done"

    assert inspect.isgeneratorfunction(stream)
    gen = stream(QUESTION)
    assert next(gen) == "France is in western Europe "
    assert gen.send("ack") == "and Paris is its capital."
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done" and received == ["ack"]
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "test_generator_stream_is_joined_and_send_is_delegated.<locals>.stream"))
    assert a[A.OUTPUT_VALUE] == ANSWER and a[A.STATUS] == "scored"


def test_generator_closed_early_is_incomplete_unless_configured(tracing, otel):
    closed = []

    @relevancy_tracer.trace
    def stream(question):
        try:
            yield "France is in western Europe."
            yield " More text nobody reads."
        finally:
            closed.append(True)

    gen = stream(QUESTION)
    assert next(gen) == "France is in western Europe."
    gen.close()  # the client went away: the answer is incomplete, and not scored by default
    assert closed == [True] and relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "test_generator_closed_early_is_incomplete_unless_configured.<locals>.stream"))
    assert a[A.STATUS] == "incomplete" and a[A.STATUS_REASON] == "stream_closed_early" and A.SCORE not in a
    otel.exporter.clear()
    tracing(score_incomplete_streams=True)
    gen = stream(QUESTION)
    next(gen)
    gen.close()
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "test_generator_closed_early_is_incomplete_unless_configured.<locals>.stream"))
    assert a[A.OUTPUT_VALUE] == "France is in western Europe." and a[A.STATUS] == "scored"


def test_generator_error_and_thrown_exceptions(tracing, otel):
    @relevancy_tracer.trace
    def stream(question):
        try:
            yield "a"
        except KeyError:
            yield "recovered"
        raise RuntimeError("stream broke")

    gen = stream(QUESTION)
    next(gen)
    assert gen.throw(KeyError("k")) == "recovered"
    with pytest.raises(RuntimeError, match="stream broke"):
        next(gen)
    relevancy_tracer.flush(5)
    span = only_span(otel, "test_generator_error_and_thrown_exceptions.<locals>.stream")
    assert span.status.status_code == StatusCode.ERROR and attrs_of(span)[A.STATUS] == "skipped"


def test_async_generator_stream(tracing, otel):
    @relevancy_tracer.trace
    async def stream(question: str):
        for piece in ("France is in western Europe ", "and Paris is its capital."):
            yield piece

    assert inspect.isasyncgenfunction(stream)

    async def consume():
        return [chunk async for chunk in stream(QUESTION)]

    assert asyncio.run(consume()) == ["France is in western Europe ", "and Paris is its capital."]
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "test_async_generator_stream.<locals>.stream"))
    assert a[A.OUTPUT_VALUE] == ANSWER and a[A.STATUS] == "scored"


def test_async_generator_delegates_asend_athrow_aclose_and_errors(tracing, otel):
    error = RuntimeError("stream broke")

    @relevancy_tracer.trace(name="astream")
    async def stream(question: str):
        sent = yield "first"
        try:
            yield f"got {sent}"
        except KeyError:
            yield "recovered"
        raise error

    @relevancy_tracer.trace(name="aclosed")
    async def closed(question: str):
        yield "a"
        yield "b"

    async def run():
        gen = stream(QUESTION)
        assert await gen.asend(None) == "first"
        assert await gen.asend("x") == "got x"
        assert await gen.athrow(KeyError("k")) == "recovered"
        with pytest.raises(RuntimeError) as raised:
            await gen.asend(None)
        assert raised.value is error  # the app's exception object, unchanged
        other = closed(QUESTION)
        assert await other.__anext__() == "a"
        await other.aclose()
        with pytest.raises(StopAsyncIteration):
            await other.__anext__()

    asyncio.run(run())
    assert relevancy_tracer.flush(10)
    failed = only_span(otel, "astream")
    assert failed.status.status_code == StatusCode.ERROR and attrs_of(failed)[A.STATUS] == "skipped"
    a = attrs_of(only_span(otel, "aclosed"))
    assert a[A.STATUS] == "incomplete" and a[A.STATUS_REASON] == "stream_closed_early"


def test_function_returning_a_stream_of_openai_style_chunks(tracing, otel):
    class Delta:
        def __init__(self, content):
            self.content = content

    class Choice:
        def __init__(self, content):
            self.delta = Delta(content)

    class Chunk:
        def __init__(self, content):
            self.choices = [Choice(content)]

    @relevancy_tracer.trace(stream=True)  # opt in: the returned generator is wrapped
    def answer(question):
        return (Chunk(piece) for piece in ("France is in western Europe ", "and Paris is its capital."))

    chunks = list(answer(QUESTION))
    assert [c.choices[0].delta.content for c in chunks] == ["France is in western Europe ", "and Paris is its capital."]
    assert relevancy_tracer.flush(10)
    assert attrs_of(only_span(otel, "test_function_returning_a_stream_of_openai_style_chunks.<locals>.answer"))[A.OUTPUT_VALUE] == ANSWER


def test_unconsumed_returned_stream_still_ends_its_span(tracing, otel):
    import gc

    @relevancy_tracer.trace(stream=True)
    def answer(question):
        return (piece for piece in ("a", "b"))

    stream = answer(QUESTION)
    del stream
    gc.collect()
    span = only_span(otel, "test_unconsumed_returned_stream_still_ends_its_span.<locals>.answer")
    assert attrs_of(span)[A.STATUS] == "skipped"


@pytest.mark.parametrize(
    "options, call, expected_question, expected_answer",
    [
        ({"question": "request.query", "answer": "return.text"}, lambda f: f(type("R", (), {"query": QUESTION})(), 1), QUESTION, ANSWER),
        ({"question": lambda call: call.arguments["request"]["q"]}, lambda f: f({"q": QUESTION}, 1), QUESTION, ANSWER),
        ({}, lambda f: f(7, QUESTION), QUESTION, ANSWER),  # first str argument
    ],
)
def test_extraction_specs(tracing, otel, options, call, expected_question, expected_answer):
    @relevancy_tracer.trace(name="extract", **options)
    def handler(request, n):
        return {"text": ANSWER, "answer": ANSWER}

    call(handler)
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "extract"))
    assert a[A.INPUT_VALUE] == expected_question and a[A.OUTPUT_VALUE] == expected_answer and a[A.STATUS] == "scored"


@pytest.mark.parametrize(
    "fn, args",
    [
        (lambda: relevancy_tracer.trace(name="x")(lambda question: 42), (QUESTION,)),  # non-str answer
        (lambda: relevancy_tracer.trace(name="x")(lambda n: ANSWER), (5,)),  # no question at all
        (lambda: relevancy_tracer.trace(name="x", question="missing.path")(lambda question: ANSWER), (QUESTION,)),
        (lambda: relevancy_tracer.trace(name="x", answer=lambda call: 1 / 0)(lambda question: ANSWER), (QUESTION,)),
    ],
)
def test_failed_extraction_is_recorded_never_raised(tracing, otel, server, fn, args):
    traced = fn()
    traced(*args)  # must not raise
    relevancy_tracer.flush(5)
    a = attrs_of(only_span(otel, "x"))
    assert a[A.STATUS] == "error" and a[A.ERROR_TYPE] == "extraction" and a[A.EXTRACTION_ERROR]
    assert server.requests == []


def test_content_capture_off_records_only_scores(tracing, otel, server):
    tracing(capture_content=False)

    @relevancy_tracer.trace(name="private")
    def answer(question, contexts=("secret context",)):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    span = only_span(otel, "private")
    dumped = json.dumps({**attrs_of(span), "events": [dict(e.attributes) for e in span.events]})
    assert attrs_of(span)[A.STATUS] == "scored" and A.SCORE in attrs_of(span)
    for text in (QUESTION, ANSWER, "secret context", "France"):
        assert text not in dumped
    assert A.GENERATED_QUESTIONS not in attrs_of(span) and A.INPUT_VALUE not in attrs_of(span)
    assert len(server.requests_to("chat")) == 1  # still scored


def test_redaction_hook_sees_texts_before_recording_and_sending(tracing, otel, server):
    seen = []

    def redact(text, field):
        seen.append(field)
        return text.replace("France", "[COUNTRY]")

    tracing(redact=redact)

    @relevancy_tracer.trace(name="redacted")
    def answer(question, contexts):
        return ANSWER

    answer(QUESTION, ["France is in Europe."])
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "redacted"))
    assert a[A.INPUT_VALUE] == "Where is [COUNTRY] and what is its capital?" and "[COUNTRY]" in a[A.OUTPUT_VALUE]
    assert a["retrieval.documents.0.document.content"] == "[COUNTRY] is in Europe."
    assert sorted(seen) == ["answer", "context", "question"]
    sent = json.dumps(server.requests)
    assert "France" not in sent and "[COUNTRY]" in sent


def test_raising_redaction_hook_sends_and_records_nothing(tracing, otel, server):
    tracing(redact=lambda text, field: (_ for _ in ()).throw(RuntimeError("hook bug")))

    @relevancy_tracer.trace(name="redacted")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    relevancy_tracer.flush(5)
    a = attrs_of(only_span(otel, "redacted"))
    assert a[A.STATUS] == "error" and a[A.ERROR_TYPE] == "redaction" and A.INPUT_VALUE not in a
    assert server.requests == []


def test_unsampled_call_costs_only_its_span(tracing, otel, server):
    tracing(sample_ratio=0.0)

    @relevancy_tracer.trace(name="unsampled")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    a = attrs_of(only_span(otel, "unsampled"))  # ended at once, before any flush
    # nothing is extracted, redacted or recorded for an unsampled call
    assert a[A.STATUS] == "not_sampled" and A.INPUT_VALUE not in a and A.SCORE not in a
    assert set(a) == {A.OPENINFERENCE_SPAN_KIND, A.STATUS}
    assert server.requests == []


def test_ratio_is_decided_on_the_trace_id(tracing, otel):
    tracing(sample_ratio=0.5)
    bound = round(0.5 * 2**64)

    @relevancy_tracer.trace(name="ratio")
    def answer(question):
        return ANSWER

    for _ in range(40):
        with otel.tracer.start_as_current_span("request"):
            answer(QUESTION)
            answer(QUESTION)  # same trace: same decision
    relevancy_tracer.flush(20)
    by_trace: dict = {}
    for span in finished_spans(otel, "ratio"):
        by_trace.setdefault(span.context.trace_id, set()).add(attrs_of(span)[A.STATUS])
    assert len(by_trace) == 40
    for trace_id, statuses in by_trace.items():
        expected = "scored" if (trace_id & (2**64 - 1)) < bound else "not_sampled"
        assert statuses == {expected}
    assert len({next(iter(s)) for s in by_trace.values()}) == 2  # both decisions occurred


def test_rate_limit_caps_evaluations(tracing, otel, server):
    tracing(rate_limit=6.0)  # 6/min: burst of 1 token

    @relevancy_tracer.trace(name="capped")
    def answer(question):
        return ANSWER

    for _ in range(5):
        answer(QUESTION)
    relevancy_tracer.flush(10)
    statuses = [attrs_of(s)[A.STATUS] for s in finished_spans(otel, "capped")]
    assert sorted(statuses) == ["not_sampled"] * 4 + ["scored"]
    assert len(server.requests_to("chat")) == 1


def test_user_sampler_composes_and_a_raising_one_is_contained(tracing, otel, server):
    tracing(sampler=lambda ctx: "Paris" in ctx.answer and ctx.span_name == "sampled")

    @relevancy_tracer.trace(name="sampled")
    def answer(question, text):
        return text

    answer(QUESTION, ANSWER)
    answer(QUESTION, "I don't know.")
    relevancy_tracer.flush(10)
    assert sorted(attrs_of(s)[A.STATUS] for s in finished_spans(otel, "sampled")) == ["not_sampled", "scored"]

    otel.exporter.clear()
    tracing(sampler=lambda ctx: 1 / 0)
    assert answer(QUESTION, ANSWER) == ANSWER
    a = attrs_of(only_span(otel, "sampled"))
    assert a[A.STATUS] == "error" and a[A.ERROR_TYPE] == "sampler"


def test_decorator_options_are_validated_at_decoration_time():
    with pytest.raises(TypeError):
        relevancy_tracer.trace(sample_ratio=0.5)(lambda question: ANSWER)
    with pytest.raises(ValueError):
        relevancy_tracer.trace(strictness=0)(lambda question: ANSWER)
    with pytest.raises(TypeError):
        relevancy_tracer.trace(question=3)(lambda question: ANSWER)


def test_per_function_method_override_puts_sub_questions_on_the_span(tracing, otel):
    @relevancy_tracer.trace(name="decomposed", method="decomposition")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "decomposed"))
    assert a[A.METHOD] == "decomposition" and a[A.STATUS] == "scored"
    assert list(a[A.SUB_QUESTIONS]) == ["Where is France?", "what is its capital?"]
    assert list(a[A.SUB_QUESTIONS_ADDRESSED]) == [True, True] and a["relevancy.components.decomposition"] == 1.0


def test_evaluation_span_mode(tracing, otel):
    tracing(attach="evaluation_span")

    @relevancy_tracer.trace(name="answer")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    answer_span = only_span(otel, "answer")  # ended at once, without waiting for the score
    assert A.SCORE not in attrs_of(answer_span)
    assert relevancy_tracer.flush(10)
    evaluator = only_span(otel, "answer_relevancy")
    a = attrs_of(evaluator)
    assert a[A.OPENINFERENCE_SPAN_KIND] == "EVALUATOR" and a[A.STATUS] == "scored" and 0 < a[A.SCORE] <= 1
    assert evaluator.parent.span_id == answer_span.context.span_id and evaluator.context.trace_id == answer_span.context.trace_id
    assert [link.context.span_id for link in evaluator.links] == [answer_span.context.span_id]
    assert evaluator.status.status_code == StatusCode.OK
    assert [e.name for e in evaluator.events] == [A.GEN_AI_EVALUATION_RESULT]
    assert a[A.EVALUATION_ID] == evaluation_id(format(answer_span.context.trace_id, "032x"), format(answer_span.context.span_id, "016x"), a[A.METHOD])


def test_flush_waits_and_times_out(tracing, otel, server):
    server.chat.push(Hang())

    @relevancy_tracer.trace(name="slow")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(timeout=0.3) is False
    assert finished_spans(otel, "slow") == []  # still held
    assert relevancy_tracer.shutdown(timeout=0.5) is False
    a = attrs_of(only_span(otel, "slow"))
    assert a[A.STATUS] == "shutdown"


def test_caller_never_waits_for_the_model(tracing, otel, server):
    for _ in range(3):
        server.chat.push(Hang())

    @relevancy_tracer.trace(name="fast")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    tracer = relevancy_tracer.tracing.lifecycle.current()
    assert tracer.jobs.depth == 1  # returned while its evaluation is still pending
    relevancy_tracer.shutdown(0.5)


def test_full_queue_drops_and_ends_spans_at_once(tracing, otel, server):
    tracing(queue_size=2, concurrency=1)
    for _ in range(10):
        server.chat.push(Hang())

    @relevancy_tracer.trace(name="busy")
    def answer(question):
        return ANSWER

    results = [answer(QUESTION) for _ in range(6)]
    assert results == [ANSWER] * 6
    dropped = finished_spans(otel, "busy")
    assert len(dropped) >= 3  # 1 running + 2 queued at most; the rest ended at once
    for span in dropped:
        a = attrs_of(span)
        assert a[A.STATUS] == "dropped" and a[A.STATUS_REASON] == "queue_full"
    relevancy_tracer.shutdown(0.5)
    spans = finished_spans(otel, "busy")
    assert len(spans) == 6 and len({s.context.span_id for s in spans}) == 6  # each ended exactly once
    assert sorted({attrs_of(s)[A.STATUS] for s in spans}) == ["dropped", "shutdown"]


def test_evaluation_deadline_and_hold_deadline(tracing, otel, server):
    tracing(evaluation_timeout=0.3, concurrency=1)
    server.chat.push(Hang())

    @relevancy_tracer.trace(name="deadline")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(5)
    a = attrs_of(only_span(otel, "deadline"))
    assert a[A.STATUS] == "timeout" and a[A.STATUS_REASON] == "evaluation_timeout" and "evaluation_timeout (0.3 s)" in a[A.ERROR]

    otel.exporter.clear()
    tracing(hold_timeout=0.3, evaluation_timeout=2, concurrency=1)
    server.chat.push(Hang())
    answer(QUESTION)  # runs (hangs) past its hold: the answer span ends deferred, the timeout goes on an EVALUATOR span
    assert relevancy_tracer.flush(5)
    assert [attrs_of(s)[A.STATUS] for s in finished_spans(otel, "deadline")] == ["deferred"]
    assert [attrs_of(s)[A.STATUS] for s in finished_spans(otel, A.EVALUATION_NAME)] == ["timeout"]
    # a call queued behind it: test_capacity.py (deferred at its hold, or ended there when it
    # cannot be scored within evaluation_timeout)


@pytest.mark.parametrize(
    "script, error_type",
    [
        (["HTTP500"], "model_error"),
        (["garbage"] * 3, "invalid_json"),
        (["drop"], "model_error"),
    ],
)
def test_misbehaving_model_endpoint_is_recorded(tracing, otel, server, script, error_type):
    from relevancy_tracer_testing import Drop, Status as HTTPStatus

    items = {"HTTP500": HTTPStatus(500), "garbage": "<html>oops</html>", "drop": Drop()}
    server.chat.push(*[items[s] for s in script])

    @relevancy_tracer.trace(name="faulty")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    assert relevancy_tracer.flush(10)
    span = only_span(otel, "faulty")
    a = attrs_of(span)
    assert a[A.STATUS] == "error" and a[A.ERROR_TYPE] == error_type and a[A.ERROR]
    assert span.status.status_code == StatusCode.UNSET  # the app's own status is left alone


def test_metrics_buckets_counts_and_attributes(tracing, otel, server):
    tracing(queue_size=1, concurrency=1)

    @relevancy_tracer.trace(name="metered")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    tracing(sample_ratio=0.0)
    answer(QUESTION)
    data = otel.reader.get_metrics_data()
    points = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    (score_point,) = [p for p in points[A.METRIC_SCORE] if p.attributes.get("span.name") == "metered"]
    assert list(score_point.explicit_bounds) == list(A.SCORE_BUCKETS) and score_point.count >= 1
    assert score_point.attributes["service.name"] == "test-rag-app"
    counts = {(p.attributes["relevancy.status"], p.attributes.get("relevancy.label")): p.value for p in points[A.METRIC_EVALUATIONS] if p.attributes["span.name"] == "metered"}
    assert counts[("not_sampled", None)] >= 1 and sum(v for (status, _), v in counts.items() if status == "scored") >= 1
    assert any(p.attributes.get("span.name") == "metered" for p in points[A.METRIC_DURATION])
    assert A.METRIC_QUEUE_DEPTH in points


def test_the_queue_depth_gauge_reads_the_current_runtime_after_configure_again(tracing, otel, server):
    """configure() again replaces the runtime; the process-wide gauge must read the new queue
    (it kept reading the first runtime's, shut down and empty, before)."""

    tracing(concurrency=1)  # a second runtime in this process at least (the fixture made one)
    gate = threading.Event()
    server.chat.push(Gate(gate))

    @relevancy_tracer.trace(name="depth")
    def answer(question):
        return ANSWER

    def depth() -> int:
        data = otel.reader.get_metrics_data()
        return sum(p.value for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == A.METRIC_QUEUE_DEPTH for p in m.data.data_points)

    try:
        for _ in range(3):
            answer(QUESTION)
        assert depth() == 3  # one running (held at the model), two queued
    finally:
        gate.set()
    assert relevancy_tracer.flush(10) and depth() == 0


def test_scorer_model_calls_are_not_app_spans(tracing, otel, server):
    """With the openai client instrumented (OpenInference), the scorer's calls leave no spans."""
    from openinference.instrumentation.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=otel.provider)
    try:
        import openai

        client = openai.OpenAI(base_url=server.base_url, api_key="x")
        client.chat.completions.create(model="fake-chat", messages=[{"role": "user", "content": "hi"}])  # the app's own call
        app_llm_spans = [s for s in finished_spans(otel) if attrs_of(s).get(A.OPENINFERENCE_SPAN_KIND) == "LLM"]
        assert len(app_llm_spans) == 1  # instrumentation works

        @relevancy_tracer.trace(name="instrumented")
        def answer(question):
            return ANSWER

        answer(QUESTION)
        assert relevancy_tracer.flush(10)
        assert attrs_of(only_span(otel, "instrumented"))[A.STATUS] == "scored"
        llm_spans = [s for s in finished_spans(otel) if attrs_of(s).get(A.OPENINFERENCE_SPAN_KIND) in ("LLM", "EMBEDDING")]
        assert len(llm_spans) == 1  # still only the app's call
    finally:
        instrumentor.uninstrument()


def test_disabled_tracer_only_calls_the_function(tracing, otel, server):
    tracing(enabled=False)

    @relevancy_tracer.trace(name="off")
    def answer(question):
        return ANSWER

    assert answer(QUESTION) == ANSWER
    assert finished_spans(otel, "off") == [] and server.requests == []


def test_settings_from_environment(monkeypatch, tracing, otel, server):
    monkeypatch.setenv("RELEVANCY_TRACER_SAMPLE_RATIO", "0")
    monkeypatch.setenv("RELEVANCY_TRACER_STRICTNESS", "not-a-number")  # warns, falls back
    tracing()

    @relevancy_tracer.trace(name="env")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert attrs_of(only_span(otel, "env"))[A.STATUS] == "not_sampled"
    assert relevancy_tracer.tracing.lifecycle.current().settings.strictness == 3


def test_call_info_is_available_to_callables(tracing, otel):
    seen = []

    def pick(call: CallInfo):
        seen.append((call.args, call.kwargs, call.arguments))
        return call.arguments["q"]

    @relevancy_tracer.trace(name="info", question=pick)
    def answer(q, k=2):
        return ANSWER

    answer(QUESTION, k=5)
    assert seen == [((QUESTION,), {"k": 5}, {"q": QUESTION, "k": 5})]


def test_span_is_current_inside_the_function(tracing, otel):
    inner = []

    @relevancy_tracer.trace(name="outer")
    def answer(question):
        with otel.tracer.start_as_current_span("retrieve"):
            inner.append(otel_trace.get_current_span().get_span_context().span_id)
        return ANSWER

    answer(QUESTION)
    relevancy_tracer.flush(10)
    retrieve = only_span(otel, "retrieve")
    assert retrieve.parent.span_id == only_span(otel, "outer").context.span_id


def test_tracer_works_in_a_forked_child(tracing, otel):
    import os

    @relevancy_tracer.trace(name="forked")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            otel.exporter.clear()
            answer(QUESTION)
            ok = relevancy_tracer.flush(10)
            statuses = [attrs_of(s).get(A.STATUS) for s in finished_spans(otel, "forked")]
            os.write(write, f"{ok}:{statuses}".encode())
        finally:
            os._exit(0)
    os.close(write)
    report = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    assert report == "True:['scored']"
    assert [attrs_of(s)[A.STATUS] for s in finished_spans(otel, "forked")] == ["scored"]  # parent unaffected


def test_on_result_hook_receives_every_outcome(tracing, otel, server):
    outcomes = []
    tracing(on_result=outcomes.append, queue_size=1, concurrency=1)
    server.chat.push(Hang())

    @relevancy_tracer.trace(name="hooked")
    def answer(question):
        return ANSWER

    answer(QUESTION)  # hangs in the worker
    assert server.wait_for_requests("chat", 1)
    answer(QUESTION)  # queued
    answer(QUESTION)  # dropped: queue full
    relevancy_tracer.shutdown(0.5)
    statuses = sorted(o.status for o in outcomes)
    assert statuses == ["dropped", "shutdown", "shutdown"]
    spans = {format(s.context.span_id, "016x"): s for s in finished_spans(otel, "hooked")}
    assert {o.span_id for o in outcomes} == set(spans)
    assert all(o.question == QUESTION and o.result is None for o in outcomes)

    otel.exporter.clear()
    outcomes.clear()
    tracing(on_result=lambda outcome: (outcomes.append(outcome), 1 / 0))  # a raising hook is contained
    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    (outcome,) = outcomes
    span = only_span(otel, "hooked")
    assert outcome.status == "scored" and outcome.result.score == attrs_of(span)[A.SCORE]
    assert outcome.trace_id == format(span.context.trace_id, "032x")


def test_default_method_components_on_the_span(tracing, otel):
    tracing(method="ragas_intent")

    @relevancy_tracer.trace(name="default_method")
    def answer(question):
        return ANSWER

    answer(QUESTION)
    assert relevancy_tracer.flush(10)
    a = attrs_of(only_span(otel, "default_method"))
    assert a[A.METHOD] == "ragas_intent" and a[A.STATUS] == "scored"
    assert a[A.SCORE] == pytest.approx(0.2 * a["relevancy.components.ragas"] + 0.8 * a["relevancy.components.intent"])
    assert len(a[A.GENERATED_QUESTIONS]) == 3 and a[A.INTENT]
