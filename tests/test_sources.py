"""`serve` reads each instrumentation by its own conventions, scores each call once whatever the
batching, and never ignores a span silently (issue 34); a span's CPU cost is linear in its size
whatever its JSON nesting (issue 35, item 1).

The attribute sets below are what the real instrumentations exported against the scripted
model (``tests/test_source_matrix.py`` runs them for real); here they are read directly, and fed
to an in-process :class:`~relevancy_tracer.service.ScoringService` as raw OTLP requests split
the ways span processors split them.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from relevancy_tracer.service import selection as selection_module
from relevancy_tracer.service.decision import COVERED, DUPLICATE, EARLY, LATE, ROOT, WINDOW, DecisionWindow
from relevancy_tracer.service.otlp import ReceivedSpan
from relevancy_tracer.service.selection import CANDIDATE, IGNORED, SKIPPED, SpanSelector

from .conftest import openai_settings
from .test_service import backend, evaluator_spans  # noqa: F401 - backend is a fixture
from .test_service_faults import export_request, kv, no_exports  # noqa: F401 - no_exports is a fixture

TRACE = "ab" * 16
SYSTEM = "Context: Lyon lies on the Rhone, at its confluence with the Saone."
HISTORY = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is Lyon?"}, {"role": "assistant", "content": "In France."}, {"role": "user", "content": "On which river?"}]


def span(attributes: dict, span_id: str = "12" * 8, parent: str = "", name: str = "call", trace: str = TRACE) -> ReceivedSpan:
    return ReceivedSpan(trace, span_id, parent, name, 1, attributes)


#: openinference-instrumentation-openai 0.1.66, chat.completions.create (as exported)
OPENINFERENCE_OPENAI = {
    "openinference.span.kind": "LLM",
    "llm.system": "openai",
    "input.value": json.dumps({"model": "gpt-4o-mini", "messages": HISTORY}),
    "input.mime_type": "application/json",
    "output.value": json.dumps({"id": "chatcmpl-1", "choices": [{"finish_reason": "stop", "index": 0, "message": {"content": "On the Rhone.", "role": "assistant"}}], "model": "gpt-4o-mini", "object": "chat.completion"}),
    "output.mime_type": "application/json",
    "llm.invocation_parameters": json.dumps({"model": "gpt-4o-mini"}),
    **{f"llm.input_messages.{i}.message.{k}": v for i, m in enumerate(HISTORY) for k, v in m.items()},
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.content": "On the Rhone.",
    "llm.model_name": "gpt-4o-mini",
}

#: @arizeai/openinference-vercel 2.8.1 on ai 6.0.325's ai.generateText span (AGENT)
VERCEL_OPENINFERENCE_AGENT = {
    "operation.name": "ai.generateText",
    "ai.operationId": "ai.generateText",
    "ai.prompt": json.dumps({"system": SYSTEM, "messages": HISTORY[1:]}),
    "ai.response.text": "On the Rhone.",
    "input.value": json.dumps({"system": SYSTEM, "messages": HISTORY[1:]}),
    "input.mime_type": "application/json",
    "output.value": "On the Rhone.",
    "output.mime_type": "text/plain",
    **{f"llm.input_messages.{i}.message.{k}": v for i, m in enumerate(HISTORY) for k, v in m.items()},
    "llm.model_name": "gpt-4o-mini",
    "openinference.span.kind": "AGENT",
}

#: the same, on its ai.generateText.doGenerate span (LLM): content parts
VERCEL_OPENINFERENCE_LLM = {
    "ai.operationId": "ai.generateText.doGenerate",
    "ai.prompt.messages": json.dumps([HISTORY[0]] + [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in HISTORY[1:]]),
    "ai.response.text": "On the Rhone.",
    "output.value": "On the Rhone.",
    "output.mime_type": "text/plain",
    "llm.input_messages.0.message.role": "system",
    "llm.input_messages.0.message.content": SYSTEM,
    **{f"llm.input_messages.{i}.message.{k}": v for i, m in enumerate(HISTORY) if i for k, v in (("role", m["role"]), ("contents.0.message_content.type", "text"), ("contents.0.message_content.text", m["content"]))},
    "input.value": json.dumps(HISTORY),
    "input.mime_type": "application/json",
    "openinference.span.kind": "LLM",
}

#: ai 6.0.325 with experimental_telemetry alone (no OpenInference processor)
VERCEL_AI = {"operation.name": "ai.generateText", "ai.operationId": "ai.generateText", "ai.model.id": "gpt-4o-mini", "ai.prompt": json.dumps({"system": SYSTEM, "messages": HISTORY[1:]}), "ai.response.text": "On the Rhone.", "ai.response.finishReason": "stop"}
VERCEL_AI_DO_GENERATE = {"ai.operationId": "ai.generateText.doGenerate", "ai.prompt.messages": VERCEL_OPENINFERENCE_LLM["ai.prompt.messages"], "ai.response.text": "On the Rhone.", "gen_ai.system": "openai.chat", "gen_ai.request.model": "gpt-4o-mini"}

#: openinference-instrumentation-llama-index 4.6.1: ContextChatEngine.chat (the trace root)
LLAMA_INDEX_CHAT = {"openinference.span.kind": "CHAIN", "input.value": json.dumps({"message": "On which river?", "chat_history": ["ChatMessage(role=<MessageRole.USER: 'user'>, blocks=[TextBlock(text='Where is Lyon?')])"]}), "input.mime_type": "application/json", "output.value": json.dumps({"response": "On the Rhone.", "sources": ["ToolOutput(...)"]}), "output.mime_type": "application/json"}

#: the Langfuse SDK's OTel export of a generation and of an @observe function
LANGFUSE_GENERATION = {"langfuse.observation.type": "generation", "langfuse.observation.model.name": "gpt-4o-mini", "langfuse.observation.input": json.dumps(HISTORY), "langfuse.observation.output": json.dumps({"role": "assistant", "content": "On the Rhone."})}
LANGFUSE_OBSERVE_MESSAGES = {"langfuse.observation.type": "span", "langfuse.observation.input": json.dumps({"args": [HISTORY[1:]], "kwargs": {}}), "langfuse.observation.output": "On the Rhone."}
LANGFUSE_OBSERVE = {"langfuse.observation.type": "span", "langfuse.observation.input": json.dumps({"args": ["On which river?"], "kwargs": {}}), "langfuse.observation.output": json.dumps("On the Rhone.")}

#: traceloop-sdk 0.62.4: an @workflow function of the chat messages (its answer.workflow span;
#: the openai.chat span inside it carries gen_ai.input.messages / gen_ai.output.messages), and an
#: @agent function of a question
TRACELOOP_WORKFLOW = {"traceloop.workflow.name": "answer", "traceloop.span.kind": "workflow", "traceloop.entity.name": "answer", "traceloop.entity.input": json.dumps({"args": [HISTORY[1:]], "kwargs": {}}), "traceloop.entity.output": json.dumps("On the Rhone.")}
TRACELOOP_AGENT = {"traceloop.span.kind": "agent", "traceloop.entity.name": "helper", "traceloop.entity.input": json.dumps({"args": ["On which river?"], "kwargs": {}}), "traceloop.entity.output": json.dumps("On the Rhone.")}


@pytest.mark.parametrize(
    "attributes, convention",
    [
        (OPENINFERENCE_OPENAI, "openinference"),
        (VERCEL_OPENINFERENCE_AGENT, "openinference"),
        (VERCEL_OPENINFERENCE_LLM, "openinference"),
        (VERCEL_AI, "vercel_ai"),
        (VERCEL_AI_DO_GENERATE, "vercel_ai"),
        (LANGFUSE_GENERATION, "langfuse"),
        (LANGFUSE_OBSERVE, "langfuse"),
        (LANGFUSE_OBSERVE_MESSAGES, "langfuse"),
        (LLAMA_INDEX_CHAT, "openinference"),
        (TRACELOOP_WORKFLOW, "traceloop"),
        (TRACELOOP_AGENT, "traceloop"),
    ],
    ids=["openinference-openai", "openinference-vercel-agent", "openinference-vercel-llm", "vercel-ai", "vercel-ai-doGenerate", "langfuse-generation", "langfuse-observe", "langfuse-observe-messages", "llama-index-chat-engine", "traceloop-workflow", "traceloop-agent"],
)
def test_each_source_reads_the_last_user_turn_and_the_reply(attributes, convention):
    """The question is the last user turn (never the system prompt holding the context, nor
    the model name); the answer the reply text (not the response JSON)."""
    assert SpanSelector().read(span(attributes)) == (CANDIDATE, ("On which river?", "On the Rhone.", convention))


def test_openai_request_and_response_json_in_input_and_output_value_alone():
    """Without llm.input_messages (an older OpenInference, a hand-made span): the request and
    response JSON are read by their shapes."""
    attributes = {k: v for k, v in OPENINFERENCE_OPENAI.items() if not k.startswith("llm.")}
    assert SpanSelector().texts(span(attributes)) == ("On which river?", "On the Rhone.", "openinference")
    responses = {k: v for k, v in attributes.items()}
    responses["output.value"] = json.dumps({"id": "resp_1", "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On the Rhone."}]}]})
    assert SpanSelector().texts(span(responses))[1] == "On the Rhone."


@pytest.mark.parametrize(
    "value, reason",
    [
        (json.dumps({"system": SYSTEM, "model": "gpt-4o-mini"}), "unknown_json"),  # the "only string field" was taken
        (json.dumps({"template": "{context} {question}", "vars": ["context"]}), "unknown_json"),
        (json.dumps([{"role": "system", "content": SYSTEM}]), "no_user_message"),
        ("[" * 100_000, "too_deep"),
        (json.dumps({"prompt": "SelectorPromptTemplate(metadata={'prompt_type': 'text_qa'}, template_vars=['context_str', 'query_str'])"}), "python_repr"),  # LlamaIndex's OpenAI.predict
        ("{'template': PromptTemplate(template='{context_str} {query_str}')}", "python_repr"),  # not JSON: a repr as text
    ],
)
def test_a_value_of_no_known_shape_yields_nothing_and_a_reason(value, reason):
    verdict, found = SpanSelector().read(span({"openinference.span.kind": "CHAIN", "input.value": value, "input.mime_type": "application/json", "output.value": "An answer."}))
    assert (verdict, found) == (SKIPPED, ("openinference", reason))


def test_a_tool_call_reply_is_skipped_with_its_reason():
    attributes = {**OPENINFERENCE_OPENAI}
    del attributes["llm.output_messages.0.message.content"]
    attributes["llm.output_messages.0.message.tool_calls.0.tool_call.function.name"] = "weather"
    assert SpanSelector().read(span(attributes)) == (SKIPPED, ("openinference", "tool_call"))


def test_traceloop_tasks_and_tools_are_steps_not_calls():
    """A Traceloop @task or @tool span is a step of its workflow or agent (a tool's input is its
    arguments, not the user's question): never a candidate, never counted as skipped."""
    for kind in ("task", "tool"):
        assert SpanSelector().read(span({**TRACELOOP_AGENT, "traceloop.span.kind": kind})) == (IGNORED, None)
    assert SpanSelector().read(span({**TRACELOOP_WORKFLOW, "traceloop.entity.input": json.dumps({"args": [HISTORY[1:], "user-7"], "kwargs": {}})})) == (SKIPPED, ("traceloop", "unknown_json"))


@pytest.mark.parametrize(
    "entity_name, args, expected",
    [
        ("traceloop_app.<locals>.Assistant.answer", ["Assistant", HISTORY[1:]], "On which river?"),  # as traceloop-sdk 0.62.4 exports an unnamed @workflow method
        ("Assistant.answer", ["Assistant", "On which river?"], "On which river?"),  # the class of the qualname: a question string too
        ("answer", ["RagAssistant", HISTORY[1:]], "On which river?"),  # @workflow(name=...): a class name, then chat messages
        ("answer", ["Assistant", "On which river?"], "unknown_json"),  # a named method of a string: f(topic, question)? not guessed
        ("answer", ["lyon", HISTORY[1:]], "unknown_json"),  # not a class name
        ("Assistant.answer", [{"model": "gpt-4o-mini"}, HISTORY[1:]], "unknown_json"),  # a dataclass / pydantic self, serialised: not recognised
        ("Assistant.answer", ["Assistant", HISTORY[1:], "user-7"], "unknown_json"),  # more arguments
        ("answer", [HISTORY[1:], "Assistant"], "unknown_json"),
    ],
)
def test_a_traceloop_method_reads_the_argument_after_self_when_unambiguous(entity_name, args, expected):
    """A decorated method passes ``self`` first; traceloop-sdk's encoder writes it as its class
    name. The question is read from the one argument after it when ``self`` is certain."""
    attributes = {**TRACELOOP_WORKFLOW, "traceloop.entity.name": entity_name, "traceloop.entity.input": json.dumps({"args": args, "kwargs": {}})}
    verdict, found = SpanSelector().read(span(attributes))
    assert (verdict, found) == ((CANDIDATE, ("On which river?", "On the Rhone.", "traceloop")) if expected == "On which river?" else (SKIPPED, ("traceloop", expected)))


#: opentelemetry-instrumentation-langchain 0.62.4 (langchain-core 1.8.0): the root
#: RunnableSequence.workflow span of ``ChatPromptTemplate | ChatOpenAI`` (as exported)
LANGCHAIN_WORKFLOW = {
    "traceloop.workflow.name": "RunnableSequence",
    "traceloop.span.kind": "workflow",
    "traceloop.entity.name": "RunnableSequence",
    "gen_ai.operation.name": "invoke_agent",
    "traceloop.entity.input": json.dumps({"inputs": {"question": "On which river?", "history": [["user", "Where is Lyon?"], ["assistant", "In France."]]}, "tags": [], "metadata": {}, "kwargs": {"name": "RunnableSequence"}}),
    "traceloop.entity.output": json.dumps({"outputs": {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "AIMessage"], "kwargs": {"content": "On the Rhone.", "additional_kwargs": {"refusal": None}, "response_metadata": {"model_name": "gpt-4o-mini", "finish_reason": "stop"}, "type": "ai", "id": "run-1", "tool_calls": [], "invalid_tool_calls": []}}, "kwargs": {"tags": []}}),
}


@pytest.mark.parametrize(
    "entity_input, entity_output",
    [
        (LANGCHAIN_WORKFLOW["traceloop.entity.input"], LANGCHAIN_WORKFLOW["traceloop.entity.output"]),
        (json.dumps({"inputs": "On which river?", "tags": [], "metadata": {}, "kwargs": {"name": "RunnableSequence"}}), json.dumps({"outputs": "On the Rhone.", "kwargs": {"tags": []}})),  # invoked with a string, ending in StrOutputParser
    ],
    ids=["prompt-chat-model", "string-in-string-out"],
)
def test_an_openllmetry_langchain_root_chain_reads_its_question_and_reply(entity_input, entity_output):
    """OpenLLMetry's LangChain instrumentation writes a root chain as a Traceloop workflow:
    ``{"inputs": ..., "tags", "metadata", "kwargs"}`` and ``{"outputs": ..., "kwargs"}``, the
    reply a serialised AIMessage (``to_json()``) or a string; tests/test_source_matrix.py runs
    the package. A serialised HumanMessage is not an answer."""
    attributes = {**LANGCHAIN_WORKFLOW, "traceloop.entity.input": entity_input, "traceloop.entity.output": entity_output}
    assert SpanSelector().read(span(attributes)) == (CANDIDATE, ("On which river?", "On the Rhone.", "traceloop"))
    human = json.loads(LANGCHAIN_WORKFLOW["traceloop.entity.output"])
    human["outputs"]["id"][-1], human["outputs"]["kwargs"]["type"] = "HumanMessage", "human"
    assert SpanSelector().read(span({**LANGCHAIN_WORKFLOW, "traceloop.entity.output": json.dumps(human)})) == (SKIPPED, ("traceloop", "unknown_json"))


def test_openllmetry_events_mode_span_awaits_its_content_events():
    """OpenLLMetry 0.52.6 in events mode sets llm.request.type=chat and no
    gen_ai.operation.name: the span is held for its gen_ai.* events."""
    assert SpanSelector().awaits_content(span({"llm.request.type": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o-mini"}))


ROLES = st.sampled_from(["system", "assistant", "tool", "developer"])
TEXT = st.text(min_size=1, max_size=30).filter(lambda t: t.strip() and not selection_module._PYTHON_REPR.match(t))  # a repr is never a question


@given(before=st.lists(st.tuples(ROLES, TEXT), max_size=4), question=TEXT, after=st.lists(st.tuples(ROLES, TEXT), max_size=3), system=TEXT, model=TEXT)
@settings(max_examples=150, deadline=None)
def test_the_question_is_always_the_last_user_turn(before, question, after, system, model):
    """Whatever system, developer, tool and assistant messages surround it, in each source's
    form, the question is the last user message."""
    messages = [{"role": r, "content": t} for r, t in before] + [{"role": "user", "content": question}] + [{"role": r, "content": t} for r, t in after]
    selector = SpanSelector()
    forms = [
        {"openinference.span.kind": "LLM", "input.value": json.dumps({"model": model, "messages": messages}), "input.mime_type": "application/json", "output.value": "A."},
        {"openinference.span.kind": "LLM", **{f"llm.input_messages.{i}.message.{k}": v for i, m in enumerate(messages) for k, v in m.items()}, "output.value": "A."},
        {"openinference.span.kind": "AGENT", "input.value": json.dumps({"system": system, "messages": messages}), "output.value": "A."},
        {"ai.operationId": "ai.streamText", "ai.prompt": json.dumps({"system": system, "messages": messages}), "ai.response.text": "A."},
        {"langfuse.observation.type": "generation", "langfuse.observation.input": json.dumps(messages), "langfuse.observation.output": json.dumps("A.")},
        {"traceloop.span.kind": "workflow", "traceloop.entity.input": json.dumps({"args": [messages], "kwargs": {}}), "traceloop.entity.output": json.dumps("A.")},
    ]
    for attributes in forms:
        assert selector.texts(span(attributes))[0] == question


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["user", "assistant", "messages", "content"]), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["role", "content", "messages", "input", "output", "choices", "message", "text", "parts", "kwargs", "args", "prompt", "x"]), inner, max_size=4), max_leaves=25)


@given(value=JSON, answer=JSON)
@settings(max_examples=200, deadline=None)
def test_any_json_value_is_read_or_skipped_never_raises(value, answer):
    for attributes in ({"openinference.span.kind": "CHAIN", "input.value": json.dumps(value), "input.mime_type": "application/json", "output.value": json.dumps(answer), "output.mime_type": "application/json"}, {"langfuse.observation.type": "agent", "langfuse.observation.input": json.dumps(value), "langfuse.observation.output": json.dumps(answer)}, {"traceloop.span.kind": "workflow", "traceloop.entity.input": json.dumps(value), "traceloop.entity.output": json.dumps(answer)}, {"ai.operationId": "ai.generateText", "ai.prompt": json.dumps(value), "ai.response.text": "A."}):
        verdict, found = SpanSelector().read(span(attributes))
        assert verdict in (CANDIDATE, SKIPPED)
        if verdict == CANDIDATE:
            assert found[0].strip() and found[1].strip()


@pytest.mark.parametrize("depth", [900, 5000])
def test_nested_json_is_parsed_once_per_attribute_whatever_its_depth(monkeypatch, depth):
    """Issue 35, item 1: JSON nested 900 deep cost 6.4 s of CPU per span: the value was
    re-serialised and re-parsed at every level (quadratic). Each attribute is parsed at most
    once now; benchmarks/hostile_json.py measures CPU seconds per request byte."""
    calls = []
    real_loads, real_dumps = json.loads, json.dumps
    monkeypatch.setattr(selection_module.json, "loads", lambda text, *a, **k: calls.append(len(text)) or real_loads(text, *a, **k))
    monkeypatch.setattr(selection_module.json, "dumps", lambda value, *a, **k: calls.append(-1) or real_dumps(value, *a, **k))
    for inner in ('{"input": ', '{"messages": [', '{"a": {"b": '):
        nested = (inner * depth + '"x"' + ("]}" if "[" in inner else "}}" if '"b"' in inner else "}") * depth)[:32_000]
        for attributes in ({"openinference.span.kind": "CHAIN", "input.value": nested, "input.mime_type": "application/json", "output.value": nested, "output.mime_type": "application/json"}, {"traceloop.span.kind": "workflow", "traceloop.entity.input": nested, "traceloop.entity.output": nested}):
            calls.clear()
            SpanSelector().read(span(attributes))
            assert len(calls) <= 2 and -1 not in calls, (inner, len(calls))


# ------------------------------------------------------------------------------ the decision window


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def chain(span_id: str, parent: str, question: str = "", trace: str = TRACE, kind: str = "CHAIN") -> ReceivedSpan:
    attributes: dict[str, Any] = {"openinference.span.kind": kind}
    if question:
        attributes.update({"input.value": question, "output.value": f"answer to {question}"})
    return ReceivedSpan(trace, span_id, parent, "step", 1, attributes)


def feed(window: DecisionWindow, spans: list[ReceivedSpan]) -> tuple[list[str], list]:
    """One export request through the window: (questions chosen at once, skipped reported)."""
    candidates, skipped = SpanSelector().classify(spans)
    with window.lock:
        plan = window.plan(spans, candidates, skipped)
        lost = window.commit(plan)
        early, more = window.enforce()
    return [c.question for c in plan.ready + early], lost + more


def due(window: DecisionWindow, everything: bool = False) -> tuple[list[str], list]:
    with window.lock:
        chosen, skipped = window.due(everything)
    return [c.question for c in chosen], skipped


# a LlamaIndex query: query (root CHAIN) > synthesize (CHAIN, template repr) > llm (LLM) ;
# query > retrieve (RETRIEVER)
QUERY = [
    chain("0" * 15 + "4", "0" * 15 + "2", "Context information is below. {context_str} Given the context answer: {query_str}", kind="LLM"),
    ReceivedSpan(TRACE, "0" * 15 + "3", "0" * 15 + "1", "retrieve", 1, {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.content": "Lyon lies on the Rhone."}),
    chain("0" * 15 + "2", "0" * 15 + "1", "{'template': PromptTemplate(...)}"),
    chain("0" * 15 + "1", "", "On which river is Lyon?"),
]


def test_spans_exported_one_by_one_are_scored_once_with_the_outermost_question():
    """A SimpleSpanProcessor: each span alone, children first. The children are held; the
    root is chosen at once, with the documents of the retriever exported before it."""
    clock = Clock()
    window = DecisionWindow(10.0, 100, 1000, 100_000, clock=clock)
    chosen = []
    for one in QUERY:
        chosen += feed(window, [one])[0]
        clock.now += 0.1
    clock.now += 60
    assert chosen + due(window)[0] == ["On which river is Lyon?"]
    assert window.outcomes == {ROOT: 1, COVERED: 1}  # the template repr is not a candidate at all


def test_a_root_arriving_first_covers_children_arriving_later_and_retries_are_duplicates():
    clock = Clock()
    window = DecisionWindow(10.0, 100, 1000, 100_000, clock=clock)
    assert feed(window, QUERY[3:])[0] == ["On which river is Lyon?"]
    assert feed(window, QUERY[:3])[0] == []
    assert feed(window, QUERY)[0] == []  # the exporter re-sends the whole request
    clock.now += 60
    assert due(window)[0] == []
    assert window.outcomes[DUPLICATE] == 2 and window.outcomes[ROOT] == 1 and window.outcomes[COVERED] == 1


def test_without_a_root_candidate_the_window_chooses_the_outermost_held_call():
    """An app span (not a candidate) holds two LLM calls, each in its own request: both are
    outermost; a nested tool-agent call is covered. Decided after `wait` with no new span."""
    clock = Clock()
    window = DecisionWindow(5.0, 100, 1000, 100_000, clock=clock)
    feed(window, [chain("a" * 16, "f" * 16, "First?", kind="LLM")])
    clock.now += 4
    feed(window, [chain("b" * 16, "f" * 16, "Second?", kind="AGENT"), chain("c" * 16, "b" * 16, "nested?", kind="LLM")])
    clock.now += 4
    assert due(window)[0] == []  # the window slides with each span of the trace
    feed(window, [ReceivedSpan(TRACE, "f" * 16, "", "handle", 1, {})])
    clock.now += 5
    assert sorted(due(window)[0]) == ["First?", "Second?"]
    assert window.outcomes == {WINDOW: 2, COVERED: 1}


def test_a_root_after_its_child_was_scored_is_counted_late_not_scored():
    clock = Clock()
    window = DecisionWindow(1.0, 100, 1000, 100_000, clock=clock)
    feed(window, [QUERY[0]])
    clock.now += 2
    assert due(window)[0] == [QUERY[0].attributes["input.value"]]
    assert feed(window, [QUERY[2], QUERY[3]])[0] == []
    assert window.outcomes[LATE] == 1


def test_the_window_is_bounded_and_decides_the_oldest_trace_early():
    clock = Clock()
    window = DecisionWindow(10.0, 50, 200, 10_000, clock=clock)
    chosen = []
    for i in range(1000):
        chosen += feed(window, [chain(f"{i + 1:016x}", "f" * 16, f"q{i}?", trace=f"{i + 1:032x}", kind="LLM")])[0]
        assert len(window) <= 50 and window.spans <= 200 and window.chars <= 10_000
    assert len(chosen) == 950 and window.outcomes[EARLY] == 950
    assert sorted(chosen + due(window, everything=True)[0]) == sorted(f"q{i}?" for i in range(1000))


def test_a_call_awaiting_events_inside_a_workflow_without_content_is_not_held_and_the_workflow_says_why():
    """traceloop-sdk with TRACELOOP_TRACE_CONTENT=false (shape as exported, tests/test_source_matrix.py
    runs it for real): the workflow has no traceloop.entity.input / .output (skipped:
    content_not_captured) and its chat span no content (awaiting events). The chat call is not
    chosen (``uncaptured``) and the workflow is reported. A chat call carrying its content
    inside such a workflow (content capture turned on for one block:
    ``override_enable_content_tracing``) is scored and the workflow is not reported."""
    clock = Clock()
    window = DecisionWindow(5.0, 100, 1000, 100_000, clock=clock)
    workflow = {"traceloop.workflow.name": "answer", "traceloop.span.kind": "workflow", "traceloop.entity.name": "answer"}
    chat = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "traceloop.workflow.name": "answer", "traceloop.entity.path": "generate"}
    task = {"traceloop.workflow.name": "answer", "traceloop.span.kind": "task", "traceloop.entity.name": "generate"}
    assert SpanSelector().read(span(workflow))[0] == SKIPPED and SpanSelector().read(span(workflow))[1] == ("traceloop", "content_not_captured")
    other = "cd" * 16
    chosen, skipped = [], []
    for one in [span(chat, "3" * 16, "2" * 16, "openai.chat"), span(task, "2" * 16, "1" * 16, "generate.task"), span(workflow, "1" * 16, "", "answer.workflow"),
                span({**chat, **genai_chat(HISTORY, "On the Rhone.")}, "3" * 16, "2" * 16, "openai.chat", other), span(task, "2" * 16, "1" * 16, "generate.task", other), span(workflow, "1" * 16, "", "answer.workflow", other)]:
        found, lost = feed(window, [one])
        chosen += found
        skipped += lost
    clock.now += 10
    found, lost = due(window)
    assert chosen + found == ["On which river?"]
    assert [(s.span.trace_id, s.span.name, s.reason) for s in skipped + lost] == [(TRACE, "answer.workflow", "content_not_captured")]
    assert window.outcomes == {"uncaptured": 1, WINDOW: 1}


def test_skipped_spans_are_reported_once_unless_a_chosen_call_covers_them():
    clock = Clock()
    window = DecisionWindow(1.0, 100, 1000, 100_000, clock=clock)
    inner = ReceivedSpan(TRACE, "9" * 16, "0" * 15 + "1", "inner", 1, {"openinference.span.kind": "CHAIN", "input.value": '{"x": 1}', "output.value": "y"})
    assert feed(window, [inner] + QUERY)[1] == []  # covered by the scored root
    alone = ReceivedSpan("cd" * 16, "8" * 16, "", "agent", 1, {"openinference.span.kind": "AGENT", "input.value": '{"system": "s"}', "output.value": "y"})
    _, skipped = feed(window, [alone])
    clock.now += 2
    skipped += due(window)[1]
    skipped += feed(window, [alone])[1]  # re-sent after its trace was decided: counted once
    clock.now += 2
    skipped += due(window)[1]
    assert [(s.source, s.reason) for s in skipped] == [("openinference", "unknown_json")]


# ------------------------------------------------------------------------------ through `serve`


def otlp_span(attributes: dict, trace_id: bytes, span_id: bytes, parent: bytes = b"", name: str = "call") -> Any:
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    items = [kv(k, v) if isinstance(v, str) else common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(int_value=v)) for k, v in attributes.items()]
    return trace_pb2.Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, attributes=items)


def post(service: Any, *spans: Any) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{service.server.http_port}/v1/traces", data=export_request(*spans).SerializeToString(), headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def test_serve_scores_a_trace_split_over_requests_and_retries_once_and_counts_what_it_skips(server, backend, caplog):
    """A LlamaIndex-shaped trace exported span by span, then re-sent whole (an exporter retry),
    and a Vercel AI SDK call whose doGenerate child comes first: one evaluation each, with the
    outermost question. A chain span with JSON of no known shape is counted by source and
    reason, logged once with its attribute keys and never its values."""
    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, capture_content=True, decision_wait=30.0), http_port=0, grpc_port=None).start()
    query, vercel, odd = os.urandom(16), os.urandom(16), os.urandom(16)
    ids = {i: os.urandom(8) for i in range(8)}
    spans = [
        otlp_span({"openinference.span.kind": "LLM", "input.value": "Context information is below. Lyon... Query: On which river is Lyon?", "output.value": "The Rhone."}, query, ids[3], ids[2]),
        otlp_span({"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.content": "Lyon lies on the Rhone."}, query, ids[4], ids[1]),
        otlp_span({"openinference.span.kind": "CHAIN", "input.value": "{'template': PromptTemplate(template='{context_str} {query_str}')}", "output.value": "The Rhone."}, query, ids[2], ids[1]),
        otlp_span({"openinference.span.kind": "CHAIN", "input.value": "On which river is Lyon?", "output.value": "Lyon is on the Rhone."}, query, ids[1]),
    ]
    try:
        for one in spans:
            assert post(service, one) == 200
        assert post(service, *spans) == 200  # re-sent
        assert post(service, otlp_span(VERCEL_AI_DO_GENERATE, vercel, ids[6], ids[5], "ai.generateText.doGenerate")) == 200
        assert post(service, otlp_span(VERCEL_AI, vercel, ids[5], b"", "ai.generateText")) == 200
        with caplog.at_level(logging.WARNING, logger="relevancy_tracer"):
            for _ in range(3):
                assert post(service, otlp_span({"openinference.span.kind": "AGENT", "input.value": json.dumps({"system": "SECRET system text", "tools": []}), "input.mime_type": "application/json", "output.value": "SECRET answer"}, odd, os.urandom(8), b"", "agent")) == 200
            assert service.flush(30)
        evaluations = backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= 2, timeout=30)
    finally:
        service.stop(10)
    evaluations = evaluator_spans(evaluations)
    assert sorted((s["trace_id"], s["parent_span_id"]) for s in evaluations) == sorted([(query.hex(), ids[1].hex()), (vercel.hex(), ids[5].hex())])
    embedded = json.dumps([r["input"] for r in server.requests_to("embeddings")] + [r["messages"] for r in server.requests_to("chat")])
    assert "On which river is Lyon?" in embedded and "On which river?" in embedded and SYSTEM not in embedded and "PromptTemplate" not in embedded
    assert service.skipped_spans == {("openinference", "unknown_json"): 3}
    logged = [r.getMessage() for r in caplog.records if "yields no question or answer" in r.getMessage()]
    assert len(logged) == 1 and "input.value" in logged[0] and "openinference.span.kind" in logged[0] and "SECRET" not in logged[0]


def genai_chat(messages: list, reply: str) -> dict:
    """openllmetry 0.62.4's openai.chat span attributes (gen_ai.* content on the span)."""
    return {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.input.messages": json.dumps([{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in messages]), "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": reply}], "finish_reason": "stop"}])}


def test_serve_scores_a_traceloop_workflow_once_with_its_question_not_each_llm_call(server, backend):
    """traceloop-sdk: an @workflow (the trace root) whose @tasks make two chat calls, a query
    rewrite and the answer, exported span by span as its SimpleSpanProcessor does (children
    first): one evaluation, on the workflow span, with the user's question and the workflow's
    answer; the rewrite call is not scored as a call of its own. A workflow whose input holds
    no known question (two arguments) is not guessed from: its chat call is scored instead,
    and the workflow is not counted skipped (the call in it was scored)."""
    from relevancy_tracer.service import ScoringService

    service = ScoringService(openai_settings(server, capture_content=True, decision_wait=30.0), http_port=0, grpc_port=None).start()
    first, second = os.urandom(16), os.urandom(16)
    ids = {i: os.urandom(8) for i in range(10)}
    rewrite = [{"role": "user", "content": "Rewrite as a search query: On which river?"}]
    task = {"traceloop.workflow.name": "answer", "traceloop.span.kind": "task"}
    spans = [
        otlp_span(genai_chat(rewrite, "Lyon river"), first, ids[3], ids[2], "openai.chat"),
        otlp_span({**task, "traceloop.entity.name": "rewrite", "traceloop.entity.input": json.dumps({"args": ["On which river?"], "kwargs": {}}), "traceloop.entity.output": json.dumps("Lyon river")}, first, ids[2], ids[1], "rewrite.task"),
        otlp_span(genai_chat(HISTORY, "On the Rhone."), first, ids[5], ids[4], "openai.chat"),
        otlp_span({**task, "traceloop.entity.name": "generate", "traceloop.entity.input": json.dumps({"args": [HISTORY[1:]], "kwargs": {}}), "traceloop.entity.output": json.dumps("On the Rhone.")}, first, ids[4], ids[1], "generate.task"),
        otlp_span(TRACELOOP_WORKFLOW, first, ids[1], b"", "answer.workflow"),
        otlp_span(genai_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is Lyon?"}], "In France."), second, ids[7], ids[6], "openai.chat"),
        otlp_span({**TRACELOOP_WORKFLOW, "traceloop.entity.input": json.dumps({"args": [[{"role": "user", "content": "Where is Lyon?"}], "user-7"], "kwargs": {}})}, second, ids[6], b"", "answer.workflow"),
    ]
    try:
        for one in spans:
            assert post(service, one) == 200
        assert service.flush(30)
        backend.wait_for_spans(lambda s: len(evaluator_spans(s)) >= 2, timeout=30)
        assert service.flush(10)
    finally:
        service.stop(10)
    assert sorted((s["trace_id"], s["parent_span_id"]) for s in evaluator_spans(backend.spans)) == sorted([(first.hex(), ids[1].hex()), (second.hex(), ids[7].hex())])
    assert service.accepted == 2
    embedded = json.dumps([r["input"] for r in server.requests_to("embeddings")] + [r["messages"] for r in server.requests_to("chat")])
    assert "On which river?" in embedded and "Where is Lyon?" in embedded and "Rewrite as a search query" not in embedded and SYSTEM not in embedded
    assert not service.skipped_spans, service.skipped_spans


def test_the_window_holds_bounded_memory_at_its_default_size():
    """Full size: 12,000 traces (the default bound is 10,000) each with an LLM call under an
    app span, a retriever with 5 documents of 2,000 characters and a 1 MB attribute on the call.
    The window stays within its bounds, holds no attribute values, and its memory is measured."""
    import tracemalloc

    from relevancy_tracer.config import Settings

    s = Settings.resolve()
    clock = Clock()
    window = DecisionWindow(s.decision_wait, s.decision_max_traces, 20 * s.decision_max_traces, 4 * s.max_request_bytes, max_documents=s.max_contexts, max_document_chars=s.max_context_chars, clock=clock)
    big = "x" * 1_000_000
    chosen = 0
    tracemalloc.start()
    try:
        for i in range(12_000):
            trace = f"{i + 1:032x}"
            call = ReceivedSpan(trace, "a" * 16, "f" * 16, "llm", 1, {"openinference.span.kind": "LLM", "input.value": f"question {i} " + "q" * 1000, "output.value": "answer " + "a" * 1000, "llm.embedding": big})
            retriever = ReceivedSpan(trace, "b" * 16, "f" * 16, "retrieve", 1, {"openinference.span.kind": "RETRIEVER", **{f"retrieval.documents.{d}.document.content": f"doc {d} " + "d" * 2000 for d in range(5)}})
            chosen += len(feed(window, [call, retriever])[0])
            clock.now += 0.001
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(window) <= s.decision_max_traces and window.spans <= 20 * s.decision_max_traces and window.chars <= 4 * s.max_request_bytes
    assert chosen >= 2_000 and chosen == window.outcomes[EARLY] and chosen + window.held() == 12_000  # the oldest decided early, none lost
    assert all(not c.span.attributes for t in window._traces.values() for c in t.open.values())
    assert held < 200 * 1024 * 1024, f"{held / 2**20:.0f} MiB held by 10,000 traces"
    print(f"decision window at its default bound: {len(window)} traces, {window.chars:,} characters, {held / 2**20:.0f} MiB held (peak {peak / 2**20:.0f} MiB)")


def test_fleet_serve_queues_one_job_for_a_trace_split_over_requests_and_retries(server, tmp_path, no_exports):
    """In fleet mode the window runs before the Redis Stream: a trace exported span by span and
    re-sent whole becomes one job, with the outermost question."""
    from relevancy_tracer.service import ScoringService
    from relevancy_tracer_testing import RedisServer

    with RedisServer(str(tmp_path)) as redis_server:
        service = ScoringService(openai_settings(server, decision_wait=30.0), queue_url=redis_server.url, http_port=0, grpc_port=None).start()
        trace, ids = os.urandom(16), [os.urandom(8) for _ in range(3)]
        spans = [
            otlp_span({"openinference.span.kind": "LLM", **{k: v for k, v in OPENINFERENCE_OPENAI.items() if k != "openinference.span.kind"}}, trace, ids[2], ids[1]),
            otlp_span({"openinference.span.kind": "CHAIN", "input.value": json.dumps({"question": "On which river?"}), "input.mime_type": "application/json", "output.value": "On the Rhone."}, trace, ids[1], ids[0]),
            otlp_span({}, trace, ids[0], b"", "GET /answer"),
        ]
        try:
            for one in spans:
                assert post(service, one) == 200
            assert post(service, *spans) == 200
            assert service.flush(10)
            jobs = [json.loads(fields[b"job"]) for _, fields in service.queue.redis.xrange(service.queue.stream)]
        finally:
            service.stop(10)
    assert [(j["trace_id"], j["span_id"], j["question"], j["answer"]) for j in jobs] == [(trace.hex(), ids[1].hex(), "On which river?", "On the Rhone.")]


@st.composite
def split_traces(draw: Any) -> tuple[list[ReceivedSpan], list[list[ReceivedSpan]]]:
    """A trace of up to 12 spans (a random tree, some of them candidates), cut into export
    requests in any order, some spans sent twice (retries, duplicates)."""
    n = draw(st.integers(1, 12))
    spans = []
    for i in range(n):
        parent = "" if i == 0 else f"{draw(st.integers(0, i - 1)) + 1:016x}"
        candidate = draw(st.booleans())
        spans.append(chain(f"{i + 1:016x}", parent, f"q{i}?" if candidate else "", kind="LLM" if candidate else "CHAIN"))
    if draw(st.booleans()):  # the root is an app span that is never a candidate, or not exported
        spans[0] = ReceivedSpan(TRACE, spans[0].span_id, "", "GET /", 1, {})
    sent = draw(st.permutations(spans)) + draw(st.lists(st.sampled_from(spans), max_size=4))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(sent) - 1)), max_size=len(sent))))
    requests = [sent[a:b] for a, b in zip([0] + cuts, cuts + [len(sent)]) if sent[a:b]]
    return spans, requests


@given(split_traces())
@settings(max_examples=300, deadline=None)
def test_whatever_the_batching_each_outermost_call_is_chosen_exactly_once(case):
    spans, requests = case
    by_id = {s.span_id: s for s in spans}
    candidates = {s.span_id for s in spans if s.attributes.get("input.value")}

    def outermost(span_id: str) -> bool:
        node = by_id[span_id].parent_span_id
        while node:
            if node in candidates:
                return False
            node = by_id[node].parent_span_id
        return True

    clock = Clock()
    window = DecisionWindow(5.0, 100, 1000, 100_000, clock=clock)
    chosen = []
    for request in requests:
        chosen += feed(window, request)[0]
        clock.now += 1.0  # less than the wait: the trace is still open
        chosen += due(window)[0]
    clock.now += 100
    chosen += due(window)[0]
    assert sorted(chosen) == sorted(by_id[i].attributes["input.value"] for i in candidates if outermost(i))


def test_a_call_awaiting_its_content_events_is_decided_before_the_join_lets_them_go():
    """A GenAI call whose content comes as log events, in a trace that keeps receiving spans
    (an agent): decided after max_pending_hold (the service passes join_ttl / 2), not after the
    trace's longer max_hold."""
    clock = Clock()
    window = DecisionWindow(10.0, 100, 1000, 100_000, max_pending_hold=15.0, clock=clock)
    chat = ReceivedSpan(TRACE, "a" * 16, "f" * 16, "chat gpt-4o", 1, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"})
    feed(window, [chat])
    chosen = []
    for i in range(20):  # a span every 5 s: the window slides
        clock.now += 5
        feed(window, [ReceivedSpan(TRACE, f"{i + 1:016x}", "f" * 16, "tool", 1, {})])
        with window.lock:
            chosen += [(c.span.span_id, c.convention) for c in window.due()[0]]
        if chosen:
            break
    assert chosen == [("a" * 16, "genai-events")] and clock.now <= 15


def test_a_retry_arriving_while_the_first_attempt_is_being_queued_is_a_duplicate_and_a_refusal_forgets_both():
    """Offers to the queue run outside the window's lock: a concurrent request carrying the
    same spans sees them reserved (duplicates); when the first attempt is refused, nothing is
    remembered, so the exporter's next retry is taken."""
    window = DecisionWindow(10.0, 100, 1000, 100_000, clock=Clock())
    candidates, skipped = SpanSelector().classify(QUERY)
    with window.lock:
        first = window.plan(QUERY, candidates, skipped)
        window.reserve(first)
        concurrent = window.plan(QUERY, *SpanSelector().classify(QUERY))
        window.release(first)  # the queue refused the first attempt: no commit
        retry = window.plan(QUERY, *SpanSelector().classify(QUERY))
    assert [c.question for c in first.ready] == ["On which river is Lyon?"] and len(first.hold) == 1
    assert not concurrent.ready and not concurrent.hold and concurrent.outcomes == {DUPLICATE: 2}
    assert [c.question for c in retry.ready] == ["On which river is Lyon?"]


def test_serve_accepts_and_discards_metrics_under_the_receivers_limits(server, no_exports):
    """SDKs export metrics to the same endpoint as traces by default (traceloop-sdk always
    does): the OpenTelemetry SDK's own OTLP metric exporters, over HTTP and gRPC, are answered
    success (not 404 / UNIMPLEMENTED: the app would log an error every export interval) and
    their metrics counted as discarded; under the receiver's rules as a trace export: the
    token, garbage 400 / INVALID_ARGUMENT, a JSON array 400, a body of max_request_bytes of
    empty metrics taken and counted exactly, one byte more 413. Log records that are not GenAI
    content events are counted as discarded too."""
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GRPCMetricExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HTTPMetricExporter
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult

    from relevancy_tracer.service import ScoringService

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("app")
    meter.create_counter("llm.calls").add(2, {"model": "gpt-4o-mini"})
    meter.create_histogram("gen_ai.client.token.usage").record(42)
    data = reader.get_metrics_data()
    limit = 64 * 1024
    token = "metrics-token"
    service = ScoringService(openai_settings(server, service_token=token, max_request_bytes=limit), http_port=0, grpc_port=0).start()
    bearer = {"authorization": f"Bearer {token}"}
    try:
        http, grpc_port = service.server.http_port, service.server.grpc_port
        assert HTTPMetricExporter(endpoint=f"http://127.0.0.1:{http}/v1/metrics", headers=bearer, timeout=10).export(data) == MetricExportResult.SUCCESS
        assert GRPCMetricExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, headers=bearer, timeout=10).export(data) == MetricExportResult.SUCCESS
        assert service.discarded == {"metrics": 4} and service.accepted == 0

        def status(body: bytes, content_type: str = "application/x-protobuf", auth: bool = True, path: str = "/v1/metrics") -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{http}{path}", data=body, headers={"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if auth else {})})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    return reply.status
            except urllib.error.HTTPError as exc:
                return exc.code

        empty_metrics = (limit - 8) // 2  # one ResourceMetrics > one ScopeMetrics > n x Metric{} (2 bytes each), 2 headers of 4 bytes
        scope = b"\x12\x00" * empty_metrics
        resource = b"\x12" + _varint(len(scope)) + scope
        full = b"\x0a" + _varint(len(resource)) + resource
        full += b"\x0a\x00" * ((limit - len(full)) // 2)  # empty ResourceMetrics up to the bound
        assert len(full) == limit
        assert status(full, auth=False) == 401
        assert status(full) == 200 and service.discarded["metrics"] == 4 + empty_metrics
        assert status(full + b"\x00") == 413
        assert status(b"\xff\x00 not protobuf") == 400 and status(b"[1, 2]", "application/json") == 400
        assert status(json.dumps({"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "a", "sum": {}}, {"name": "b"}]}]}]}).encode(), "application/json") == 200
        assert service.discarded["metrics"] == 4 + empty_metrics + 2
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
            with pytest.raises(grpc.RpcError) as bad:
                export(b"\xff\x00 not protobuf", metadata=tuple(bearer.items()), timeout=10)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as denied:
                export(full, timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert status(b"", path="/v1/profiles") == 404
        app_logs = logs_service_pb2.ExportLogsServiceRequest(resource_logs=[logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=[logs_pb2.LogRecord(trace_id=os.urandom(16), span_id=os.urandom(8), event_name="app.request")] * 3)])])
        assert status(app_logs.SerializeToString(), path="/v1/logs") == 200
        assert service.discarded == {"metrics": 4 + empty_metrics + 2, "logs": 3} and service.accepted == 0
    finally:
        service.stop(10)


def _varint(value: int) -> bytes:
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            return out + bytes([byte])
        out += bytes([byte | 0x80])
