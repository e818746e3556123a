"""Reading by convention, not by library (issue 41), and the conversation's earlier turns (issue
44): the shapes below are cut from the recordings of real libraries in
``tests/sources/recordings/`` (``tests/test_recorded_sources.py`` replays them whole).
"""

from __future__ import annotations

import json

import pytest

from relevancy_tracer.service.join import content_of
from relevancy_tracer.service.otlp import MAX_SPAN_EVENTS, ReceivedLog, ReceivedSpan, SpanEvent
from relevancy_tracer.service.selection import CANDIDATE, SKIPPED, SpanSelector

TRACE = "cd" * 16
TURNS = [("user", "Where is Lyon?"), ("assistant", "Lyon is in France."), ("user", "On which river is Lyon?")]
HISTORY = [{"role": "user", "content": "Where is Lyon?"}, {"role": "assistant", "content": "Lyon is in France."}]
SYSTEM = "Answer from this context only."


def span(attributes: dict, events: list[SpanEvent] = (), span_id: str = "34" * 8, parent: str = "") -> ReceivedSpan:
    return ReceivedSpan(TRACE, span_id, parent, "call", 1, attributes, events=list(events))


def read(item: ReceivedSpan) -> tuple[str, tuple]:
    return SpanSelector().read_turns(item)


def test_openinference_messages_give_the_earlier_turns():
    """``llm.input_messages`` of a multi-turn LLM span: the question is the last user turn, the
    history the user and assistant turns before it, oldest first, without the system or tool
    messages or a tool call's empty assistant turn."""
    messages = [
        ("system", SYSTEM),
        ("user", "Where is Lyon?"),
        ("assistant", None),
        ("tool", "sunny"),
        ("assistant", "Lyon is in France."),
        ("user", "On which river is Lyon?"),
    ]
    attributes = {
        "openinference.span.kind": "LLM",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "Lyon is on the Rhone.",
    }
    for i, (role, text) in enumerate(messages):
        attributes[f"llm.input_messages.{i}.message.role"] = role
        if text is not None:
            attributes[f"llm.input_messages.{i}.message.content"] = text
    verdict, (question, answer, convention, history) = read(span(attributes))
    assert (verdict, question, answer, convention) == (
        CANDIDATE,
        "On which river is Lyon?",
        "Lyon is on the Rhone.",
        "openinference",
    )
    assert history == HISTORY
    one = {k: v for k, v in attributes.items() if not k.startswith("llm.input_messages.")} | {
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "Where is Lyon?",
    }
    assert read(span(one))[1][3] == []  # a single turn has no history


def test_genai_input_messages_give_the_earlier_turns_on_the_span_and_in_events():
    """``gen_ai.input.messages`` (parts), on the span and in an ``operation.details`` log event."""
    messages = [{"role": "system", "parts": [{"type": "text", "content": SYSTEM}]}] + [
        {"role": role, "parts": [{"type": "text", "content": text}]} for role, text in TURNS
    ]
    output = [
        {"role": "assistant", "parts": [{"type": "text", "content": "Lyon is on the Rhone."}], "finish_reason": "stop"}
    ]
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(messages),
        "gen_ai.output.messages": json.dumps(output),
    }
    assert read(span(attributes)) == (CANDIDATE, ("On which river is Lyon?", "Lyon is on the Rhone.", "genai", HISTORY))
    record = ReceivedLog(
        TRACE,
        "34" * 8,
        "gen_ai.client.inference.operation.details",
        None,
        {"gen_ai.input.messages": json.dumps(messages), "gen_ai.output.messages": json.dumps(output)},
        time_ns=5,
    )
    content = content_of(record, 1)
    assert (
        content.outcome() == (("On which river is Lyon?", "Lyon is on the Rhone."), None) and content.history == HISTORY
    )


def test_genai_message_log_events_give_the_earlier_turns_in_their_order():
    """One ``gen_ai.<role>.message`` event per input message (OpenTelemetry's openai-v2, Semantic
    Kernel's JSON-string bodies): the history is the turns before the last user message."""
    from relevancy_tracer.service.join import ContentJoin

    records = [
        ReceivedLog(
            TRACE,
            "34" * 8,
            "",
            json.dumps({"role": "system", "content": SYSTEM}),
            {"event.name": "gen_ai.system.message"},
            time_ns=1,
        )
    ]
    records += [
        ReceivedLog(TRACE, "34" * 8, f"gen_ai.{role}.message", {"content": text}, {}, time_ns=2 + i)
        for i, (role, text) in enumerate(TURNS)
    ]
    records.append(
        ReceivedLog(
            TRACE,
            "34" * 8,
            "",
            json.dumps({"message": {"role": "assistant", "content": "Lyon is on the Rhone."}, "finish_reason": "stop"}),
            {"event.name": "gen_ai.choice"},
            time_ns=9,
        )
    )
    content = ContentJoin(30, 10, 10_000).fold(records)[(TRACE, "34" * 8)]
    assert content.outcome() == (("On which river is Lyon?", "Lyon is on the Rhone."), None)
    assert content.history == HISTORY


@pytest.mark.parametrize(
    "value",
    [
        {
            "messages": [
                ["user", "Where is Lyon?"],
                ["assistant", "Lyon is in France."],
                ["user", "On which river is Lyon?"],
            ]
        },  # LangGraph's input
        {
            "messages": [
                {"type": t, "data": {"content": c, "type": t}}
                for t, c in (
                    ("human", "Where is Lyon?"),
                    ("ai", "Lyon is in France."),
                    ("human", "On which river is Lyon?"),
                )
            ]
        },  # its state
        [
            {"role": "user", "content": "Where is Lyon?"},
            {"role": "assistant", "content": "Lyon is in France."},
            {"role": "user", "content": "On which river is Lyon?"},
        ],  # OpenAI Agents' input
    ],
)
def test_serialised_chat_messages_of_agent_frameworks_give_the_question_and_history(value):
    attributes = {
        "openinference.span.kind": "CHAIN",
        "input.value": json.dumps(value),
        "input.mime_type": "application/json",
        "output.value": "Lyon is on the Rhone.",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "Where is Lyon?",
    }  # LangGraph writes only the first
    assert read(span(attributes)) == (
        CANDIDATE,
        ("On which river is Lyon?", "Lyon is on the Rhone.", "openinference", HISTORY),
    )


def state(*messages: tuple[str, str, bool]) -> str:
    return json.dumps(
        {
            "messages": [
                {
                    "type": t,
                    "data": {
                        "content": c,
                        "type": t,
                        **({"tool_calls": [{"name": "get_weather", "args": {}, "id": "c"}]} if tool else {}),
                    },
                }
                for t, c, tool in messages
            ]
        }
    )


@pytest.mark.parametrize(
    "output, expected",
    [
        (
            state(
                ("human", "What is the weather?", False),
                ("ai", "", True),
                ("tool", "sunny", False),
                ("ai", "It is sunny.", False),
            ),
            (CANDIDATE, "It is sunny."),
        ),
        (
            state(("human", "What is the weather?", False), ("ai", "", True)),
            (SKIPPED, "tool_call"),
        ),  # a node's step that calls a tool
        (state(("tool", "sunny", False)), (SKIPPED, "no_answer")),  # the tools node
        ("__end__", (SKIPPED, "no_answer")),  # a conditional edge's routing decision
    ],
)
def test_a_langgraph_state_reads_its_last_message_and_routing_is_never_an_answer(output, expected):
    attributes = {
        "openinference.span.kind": "CHAIN",
        "input.value": json.dumps({"messages": [["user", "What is the weather?"]]}),
        "input.mime_type": "application/json",
        "output.value": output,
    }
    verdict, value = SpanSelector().read(span(attributes))
    assert (verdict, value[1] if verdict == CANDIDATE else value[1]) == expected


def response(output: list) -> dict:
    return {"id": "resp_1", "object": "response", "model": "gpt-4o-mini", "output": output}


TEXT = [
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
    }
]
CALL = [{"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"}]


@pytest.mark.parametrize(
    "output, expected",
    [
        ([response(TEXT)], (CANDIDATE, "It is sunny.")),  # OpenAI Agents' generation span: a list of responses
        (response(TEXT), (CANDIDATE, "It is sunny.")),
        ([response(CALL)], (SKIPPED, "tool_call")),
    ],
)
def test_responses_api_output_as_an_object_or_a_list(output, expected):
    inputs = [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "sunny"},
    ]
    attributes = {
        "openinference.span.kind": "LLM",
        "input.value": json.dumps(inputs),
        "input.mime_type": "application/json",
        "output.value": json.dumps(output),
        "output.mime_type": "application/json",
    }
    verdict, value = SpanSelector().read(span(attributes))
    assert (verdict, value[1]) == expected
    if verdict == CANDIDATE:
        assert value[0] == "What is the weather?"


def test_an_agent_run_reads_its_task_and_final_answer():
    """smolagents' ``ToolCallingAgent.run``: ``{"task": ...}`` in, the final answer as text out."""
    attributes = {
        "openinference.span.kind": "AGENT",
        "input.value": json.dumps({"task": "What is the weather?", "stream": False, "reset": True, "images": None}),
        "output.value": "It is sunny.",
    }
    assert SpanSelector().read(span(attributes)) == (
        CANDIDATE,
        ("What is the weather?", "It is sunny.", "openinference"),
    )


@pytest.mark.parametrize(
    "kind, inputs, outputs, expected",
    [
        (
            "UNKNOWN",
            {"messages": [{"role": "user", "content": "What is the weather?"}]},
            "It is sunny.",
            (CANDIDATE, ("What is the weather?", "It is sunny.", "mlflow")),
        ),
        (
            "CHAT_MODEL",
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "What is the weather?"},
                ],
            },
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "It is sunny."}}]},
            (CANDIDATE, ("What is the weather?", "It is sunny.", "mlflow")),
        ),
        (
            "CHAT_MODEL",
            {"model": "m", "messages": [{"role": "user", "content": "What is the weather?"}]},
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                        },
                    }
                ]
            },
            (SKIPPED, ("mlflow", "tool_call")),
        ),
        ("TOOL", {"city": "Lyon"}, "sunny", (SKIPPED, ("mlflow", "step"))),
    ],
)
def test_mlflow_span_inputs_and_outputs_by_span_type(kind, inputs, outputs, expected):
    """MLflow writes every attribute as JSON (``mlflow.spanType`` = ``"\\"CHAT_MODEL\\""``)."""
    attributes = {
        "mlflow.spanType": json.dumps(kind),
        "mlflow.spanInputs": json.dumps(inputs),
        "mlflow.spanOutputs": json.dumps(outputs),
        "mlflow.traceRequestId": json.dumps("tr-1"),
    }
    assert SpanSelector().read(span(attributes)) == expected


def strands_events(choice: str, *turns: tuple[str, str]) -> list[SpanEvent]:
    events = [SpanEvent("gen_ai.system.message", 1, {"content": json.dumps([{"text": SYSTEM}])})]
    events += [
        SpanEvent(f"gen_ai.{role}.message", 2 + i, {"content": json.dumps([{"text": text}])})
        for i, (role, text) in enumerate(turns)
    ]
    return events + [SpanEvent("gen_ai.choice", 9, {"message": choice, "finish_reason": "end_turn"})]


def test_genai_content_in_span_events_is_read_as_log_events_are():
    """Strands Agents: the messages as span events, content blocks as JSON strings; an agent's
    final answer as plain text; a tool-call turn counted ``tool_call`` at once; a tool's
    execution a step."""
    chat = span(
        {"gen_ai.operation.name": "chat"}, strands_events(json.dumps([{"text": "Lyon is on the Rhone."}]), *TURNS)
    )
    assert read(chat) == (CANDIDATE, ("On which river is Lyon?", "Lyon is on the Rhone.", "genai", HISTORY))
    agent = span({"gen_ai.operation.name": "invoke_agent"}, strands_events("Lyon is on the Rhone.\n", TURNS[-1]))
    assert read(agent) == (CANDIDATE, ("On which river is Lyon?", "Lyon is on the Rhone.", "genai", []))
    tool_turn = span(
        {"gen_ai.operation.name": "chat"},
        strands_events(json.dumps([{"toolUse": {"toolUseId": "c", "name": "get_weather", "input": {}}}]), TURNS[-1]),
    )
    assert read(tool_turn) == (SKIPPED, ("genai", "tool_call"))
    tool = span(
        {"gen_ai.operation.name": "execute_tool"},
        [
            SpanEvent("gen_ai.tool.message", 1, {"role": "tool", "content": "{}"}),
            SpanEvent("gen_ai.choice", 2, {"message": json.dumps([{"text": "sunny"}])}),
        ],
    )
    assert read(tool) == (SKIPPED, ("genai", "step"))
    latest = span(
        {"gen_ai.operation.name": "chat"},
        [
            SpanEvent(
                "gen_ai.client.inference.operation.details",
                1,
                {
                    "gen_ai.input.messages": json.dumps(
                        [{"role": r, "parts": [{"type": "text", "content": t}]} for r, t in TURNS]
                    )
                },
            ),
            SpanEvent(
                "gen_ai.client.inference.operation.details",
                2,
                {
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": [{"type": "text", "content": "Lyon is on the Rhone."}]}]
                    )
                },
            ),
        ],
    )
    assert read(latest) == (CANDIDATE, ("On which river is Lyon?", "Lyon is on the Rhone.", "genai", HISTORY))


def test_a_genai_tool_call_turn_on_the_span_is_skipped_at_once_not_held():
    """pydantic-ai, OpenLIT: a tool-call turn's chat span carries its output messages; it is
    counted ``tool_call``, not held for content events that will not come."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "What is the weather?"}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "tool_call", "name": "get_weather", "id": "c", "arguments": {}}]}]
        ),
    }
    assert SpanSelector().read(span(attributes)) == (SKIPPED, ("genai", "tool_call"))


def test_semantic_kernel_json_string_bodies_are_read_and_content_not_captured_means_no_content():
    body = json.dumps({"message": {"role": "assistant", "content": "It is sunny."}, "finish_reason": "stop"})
    choice = content_of(ReceivedLog(TRACE, "34" * 8, "", body, {"event.name": "gen_ai.choice"}), 1)
    user = content_of(
        ReceivedLog(
            TRACE,
            "34" * 8,
            "",
            json.dumps({"role": "user", "content": "What is the weather?"}),
            {"event.name": "gen_ai.user.message"},
        ),
        0,
    )
    assert user.merge(choice).outcome() == (("What is the weather?", "It is sunny."), None)
    bare = content_of(
        ReceivedLog(
            TRACE,
            "34" * 8,
            "gen_ai.choice",
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}},
            {},
        ),
        1,
    )
    assert bare.outcome() == (None, "content_not_captured")  # capture off: no content field at all
    odd = content_of(
        ReceivedLog(
            TRACE,
            "34" * 8,
            "gen_ai.choice",
            {"index": 0, "message": {"role": "assistant", "content": {"unknown": 1}}},
            {},
        ),
        1,
    )
    assert odd.outcome() == (None, "no_answer")  # content of a form not read is not "capture off"


def test_span_events_are_bounded_and_only_genai_ones_kept():
    """A span of thousands of events keeps its last :data:`MAX_SPAN_EVENTS` GenAI ones."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    proto = (
        request.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex("34" * 8), name="chat")
    )
    for i in range(5000):
        event = proto.events.add(name="gen_ai.user.message" if i % 2 else "exception", time_unix_nano=i)
        event.attributes.add(key="content").value.string_value = "x" * 100
    from relevancy_tracer.service.otlp import spans_of

    (received,) = spans_of(request, max_text_chars=10)
    assert len(received.events) == MAX_SPAN_EVENTS // 2 and all(
        e.name == "gen_ai.user.message" for e in received.events
    )
    assert received.events[-1].time_ns == 4999 and received.events[0].attributes["content"] == "x" * 10


def test_an_unreadable_agent_run_is_answered_by_its_last_call_not_each_step():
    """An AGENT root without input (OpenAI Agents' ``Agent workflow``) around two LLM calls
    that both produce text: only the last to end is the run's call; the earlier is a step
    (counted ``covered``). Under a CHAIN root without content both stay calls."""
    from relevancy_tracer.service.decision import COVERED, DecisionWindow

    def llm(span_id: str, question: str, answer: str, end: int) -> ReceivedSpan:
        attributes = {"openinference.span.kind": "LLM", "input.value": question, "output.value": answer}
        return ReceivedSpan(TRACE, span_id, "01" * 8, "response", 1, attributes, start_ns=end - 1, end_ns=end)

    for kind, expected in (("AGENT", ["Lyon is on the Rhone."]), ("CHAIN", ["Let me look.", "Lyon is on the Rhone."])):
        spans = [
            llm("02" * 8, "On which river is Lyon?", "Let me look.", 10),
            llm("03" * 8, "On which river is Lyon?", "Lyon is on the Rhone.", 20),
            ReceivedSpan(TRACE, "01" * 8, "", "Agent workflow", 1, {"openinference.span.kind": kind}),
        ]
        window = DecisionWindow(5.0, 100, 1000, 100_000)
        candidates, skipped = SpanSelector().classify(spans)
        with window.lock:
            window.commit(window.plan(spans, candidates, skipped))
            chosen, lost = window.due(everything=True)
        assert sorted(c.answer for c in chosen) == expected
        assert window.outcomes.get(COVERED, 0) == (1 if kind == "AGENT" else 0)
        assert [(s.source, s.reason) for s in lost] == []  # the root holds the chosen call


def test_span_events_kept_per_request_are_bounded():
    """4,000 spans of 128 one-attribute GenAI events (14 MB): :data:`MAX_REQUEST_EVENTS` are
    kept in all, the later spans keep none; decoding them costs a few MB of Python objects."""
    import tracemalloc

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from relevancy_tracer.service.otlp import MAX_REQUEST_EVENTS, spans_of

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(4000):
        proto = scope.spans.add(trace_id=bytes.fromhex(TRACE), span_id=(i + 1).to_bytes(8, "big"), name="chat")
        for _ in range(128):
            proto.events.add(name="gen_ai.choice").attributes.add(key="message").value.string_value = "x"
    tracemalloc.start()
    try:
        received = spans_of(request, max_text_chars=32001)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(len(s.events) for s in received) == MAX_REQUEST_EVENTS and not received[-1].events
    assert peak < 32 << 20


def test_a_tool_call_turn_with_its_question_on_the_span_and_no_reply_text_is_skipped_at_once():
    """OpenLIT: the prompt on the span, no completion text, finish reason ``tool_calls``."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.prompt": json.dumps([{"role": "user", "content": "What is the weather?"}]),
        "gen_ai.response.finish_reasons": ["tool_calls"],
    }
    assert SpanSelector().read(span(attributes)) == (SKIPPED, ("genai", "tool_call"))
    del attributes["gen_ai.response.finish_reasons"]
    assert SpanSelector().read(span(attributes)) == ("pending", None)  # its reply may come as events
