"""A follow-up judged in its conversation: reading the history, its bounds, and every path
(engine, score(), the decorator, the CLI) against the OpenAI-compatible test server."""

from __future__ import annotations

import json
import subprocess
import sys
from enum import Enum

import pytest

import relevancy_tracer
from relevancy_tracer.otel import attributes as A
from relevancy_tracer.scoring import conversation as C
from relevancy_tracer.scoring.engine import Engine

from .conftest import fake_model_env, finished_spans, openai_settings, subprocess_env

HISTORY = [
    {"role": "system", "content": "You answer from the documents."},
    {"role": "user", "content": "How are dividends taxed in a trust?"},
    {"role": "assistant", "content": "A trust pays tax on dividends it keeps at the trust rate; dividends it pays out are taxed on the beneficiaries."},
]
QUESTION = "I'm in US, give me a rate here"
ANSWER = "In the US, qualified dividends are taxed at 0%, 15% or 20% depending on income; ordinary dividends at the income tax rate."


# ------------------------------------------------------------------------- reading a history


class LangChainLike:
    """A LangChain message as plain data (type and content fields)."""

    def __init__(self, kind: str, content: object):
        self.type = kind
        self.content = content


class Role(str, Enum):
    USER = "user"
    ASSISTANT = "assistant"


class TextBlock:
    def __init__(self, text: str):
        self.text = text


class LlamaIndexLike:
    """A LlamaIndex >= 0.12 ChatMessage: a role enum, text in blocks, content a property."""

    ran = 0

    def __init__(self, role: Role, text: str):
        self.role = role
        self.blocks = [TextBlock(text)]

    @property
    def content(self) -> str:  # app code: the reader must not run it
        LlamaIndexLike.ran += 1
        raise AssertionError("a property of the app ran")


def test_history_of_every_known_shape_is_read_as_user_and_assistant_turns():
    openai_style = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": "reply"},
        {"role": "tool", "content": "tool output"},
    ]
    langchain = [LangChainLike("system", "sys"), LangChainLike("human", "first"), LangChainLike("ai", "reply")]
    llama = [LlamaIndexLike(Role.USER, "first"), LlamaIndexLike(Role.ASSISTANT, "reply")]
    pairs = [("user", "first"), ("assistant", "reply")]
    for value in (openai_style, langchain, llama, pairs, tuple(pairs)):
        past = C.read_history(value, 8, 6000)
        assert past.turns == (C.Turn("user", "first"), C.Turn("assistant", "reply")), value
    assert LlamaIndexLike.ran == 0
    assert not C.read_history(None, 8, 6000) and not C.read_history([], 8, 6000)


@pytest.mark.parametrize("value", ["a string", {"role": "user", "content": "x"}, [1, 2], [{"content": "no role"}], [{"role": "wizard", "content": "x"}], 42])
def test_a_history_of_no_known_shape_is_refused(value):
    with pytest.raises(C.HistoryError):
        C.read_history(value, 8, 6000)


def test_history_is_bounded_in_turns_and_characters_and_reads_only_its_tail():
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 5000} for i in range(1_000_000)]
    past = C.read_history(many, 6, 4000)
    assert len(past.turns) <= 6 and past.truncated
    assert sum(len(t.content) for t in past.turns) <= 4000
    assert all(len(t.content) <= 2000 for t in past.turns)
    assert past.turns[-1].content.startswith("turn 999999")  # the most recent turns are kept
    # a hostile item deep in the list is never looked at: only the last 4 x turns + 8 are
    poisoned = [object()] + many[-20:]
    assert C.read_history(poisoned, 3, 4000).turns
    with pytest.raises(C.HistoryError):
        C.read_history(poisoned, 100, 4000)
    assert C.read_history(many[-10:], 0, 4000).turns == ()


def test_repeat_tells_a_repeated_earlier_answer_from_a_new_one():
    past = C.read_history(HISTORY, 8, 6000).turns
    assert C.repeat(HISTORY[2]["content"], past) == 1.0
    assert C.repeat(ANSWER, past) < 0.2
    assert C.repeat("", past) == 0.0
    assert C.repeat("在提供的资料里找不到相关信息", [C.Turn("assistant", "在提供的资料里找不到相关信息。")]) == 1.0


def test_the_last_user_message_of_a_messages_list_is_the_question():
    messages = HISTORY + [{"role": "user", "content": QUESTION}]
    question, past = C.split_last_question(messages, 8, 6000)
    assert question == QUESTION and [t.role for t in past.turns] == ["user", "assistant"]
    # an app that appended its reply already: the question is still the last user message
    question, past = C.split_last_question(messages + [{"role": "assistant", "content": "reply"}], 8, 6000)
    assert question == QUESTION and len(past.turns) == 2
    assert C.split_last_question([{"role": "assistant", "content": "hi"}], 8, 6000) is None
    assert C.split_last_question("not a list", 8, 6000) is None


# ------------------------------------------------------------------------- the engine


def test_with_history_the_answer_is_judged_against_a_standalone_question(server):
    engine = Engine(openai_settings(server, method="ragas_judge_intent"))
    alone = engine.score(QUESTION, ANSWER)
    chats_alone = len(server.requests_to("chat"))
    assert alone.ok and alone.standalone_question is None and alone.history_status is None and alone.history_turns == 0
    assert not any("<conversation>" in json.dumps(r) for r in server.requests_to("chat"))

    server.requests.clear()
    result = engine.score(QUESTION, ANSWER, history=HISTORY)
    assert result.ok and result.history_status == "read" and result.history_turns == 2
    assert result.standalone_question == f"{QUESTION} (in a conversation about: How are dividends taxed in a trust?)"
    rewrites = [r for r in server.requests_to("chat") if "<conversation>" in json.dumps(r)]
    assert len(rewrites) == 1 and "You answer from the documents." not in json.dumps(rewrites)  # system turns left out
    # one more chat request than alone: the rewrite (the intent statement is per question, and the
    # standalone question is a new one)
    assert result.llm_calls == alone.llm_calls + 1
    assert "repeat" in result.components and result.components["repeat"] < 0.2
    assert result.evaluator_version != alone.evaluator_version  # the conversation evaluator is its own
    # the earlier answer, repeated, gets no topical credit: it answered the earlier question
    repeated = engine.score(QUESTION, HISTORY[2]["content"], history=HISTORY)
    assert repeated.components["repeat"] == 1.0 and repeated.components["topicality"] == 0.0
    assert repeated.raw_score < result.raw_score
    # the rewrite is cached per conversation and question: the second answer asked none
    assert len([r for r in server.requests_to("chat") if "<conversation>" in json.dumps(r)]) == 1
    assert chats_alone > 0


def test_without_history_nothing_changes(server):
    engine = Engine(openai_settings(server, method="ragas_judge_intent"))
    before = engine.score(QUESTION, ANSWER)
    for empty in (None, [], [{"role": "system", "content": "only a system prompt"}]):
        again = engine.score(QUESTION, ANSWER, history=empty)
        assert again.score == before.score and again.llm_calls <= before.llm_calls and again.history_status is None
        assert again.evaluator_version == before.evaluator_version and "repeat" not in again.components


def test_a_history_of_the_wrong_shape_is_judged_single_turn_with_its_reason(server):
    engine = Engine(openai_settings(server, method="ragas_judge_intent"))
    before = engine.score(QUESTION, ANSWER)
    result = engine.score(QUESTION, ANSWER, history={"not": "a list"})
    assert result.ok and result.history_status == "invalid" and result.standalone_question is None
    assert result.score == before.score and result.evaluator_version == before.evaluator_version


def test_score_api_takes_history_and_content_off_hides_the_standalone_question(server):
    relevancy_tracer.configure(method="ragas_judge_intent", llm_timeout=5.0, setup_otel=False, **{k: v for k, v in openai_settings(server).__dict__.items() if k in ("llm", "embeddings", "llm_base_url", "llm_model", "embedding_model")})
    try:
        result = relevancy_tracer.score(QUESTION, ANSWER, history=HISTORY)
        assert result.ok and result.standalone_question and result.history_turns == 2
        hidden = result.without_content()
        assert hidden.standalone_question is None and hidden.history_turns == 2
    finally:
        relevancy_tracer.shutdown(5.0)


# ------------------------------------------------------------------------- the decorator


def _attrs(otel, name):
    (span,) = finished_spans(otel, name)
    return dict(span.attributes or {})


def test_decorator_reads_a_messages_list_and_a_history_parameter(tracing, otel, server):
    tracing(method="ragas_judge_intent")

    @relevancy_tracer.trace(name="chat")
    def chat(messages):
        messages.append({"role": "assistant", "content": ANSWER})  # apps append their reply: no effect on what was read
        return ANSWER

    @relevancy_tracer.trace(name="rag")
    def rag(question, chat_history):
        return ANSWER

    @relevancy_tracer.trace(name="explicit", history="request.turns", question="request.text")
    def explicit(request):
        return ANSWER

    messages = HISTORY + [{"role": "user", "content": QUESTION}]
    assert chat(messages) == ANSWER and messages[-1]["content"] == ANSWER
    assert rag(QUESTION, HISTORY[1:]) == ANSWER
    assert explicit({"text": QUESTION, "turns": HISTORY}) == ANSWER
    assert relevancy_tracer.flush(20)
    for name in ("chat", "rag", "explicit"):
        a = _attrs(otel, name)
        assert a[A.STATUS] == "scored", (name, a)
        assert a[A.HISTORY_STATUS] == "read" and a[A.HISTORY_TURNS] == 2, name
        assert a[A.STANDALONE_QUESTION].startswith(QUESTION), name
        assert a[A.INPUT_VALUE] == QUESTION


def test_decorator_history_of_wrong_shape_is_counted_and_scored_single_turn(tracing, otel, server):
    tracing(method="ragas_judge_intent")

    @relevancy_tracer.trace(name="odd")
    def odd(question, history):
        return ANSWER

    assert odd(QUESTION, "not a list of messages") == ANSWER
    assert relevancy_tracer.flush(20)
    a = _attrs(otel, "odd")
    assert a[A.STATUS] == "scored" and a[A.HISTORY_STATUS] == "invalid" and A.STANDALONE_QUESTION not in a
    points = [
        p
        for m in otel.reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
        if m.name == A.METRIC_HISTORY
        for p in m.data.data_points
        if p.attributes.get(A.ATTR_SPAN_NAME) == "odd"
    ]
    assert points and points[0].attributes[A.HISTORY_STATUS] == "invalid" and points[0].value == 1


def test_decorator_content_off_sends_no_turn_to_spans_and_redaction_sees_turns(tracing, otel, server):
    seen = []

    def redact(text, field):
        seen.append(field)
        return text.replace("trust", "[REDACTED]")

    tracing(method="ragas_judge_intent", capture_content=False, redact=redact)

    @relevancy_tracer.trace(name="private")
    def rag(question, history):
        return ANSWER

    rag(QUESTION, HISTORY)
    assert relevancy_tracer.flush(20)
    (span,) = finished_spans(otel, "private")
    dumped = json.dumps({**dict(span.attributes), "events": [dict(e.attributes) for e in span.events]})
    assert dict(span.attributes)[A.HISTORY_TURNS] == 2
    for text in ("dividends", "trust", QUESTION):
        assert text not in dumped
    assert seen.count("history") == 2
    assert "trust" not in json.dumps(server.requests_to("chat")) and "[REDACTED]" in json.dumps(server.requests_to("chat"))


# ------------------------------------------------------------------------- the CLI


def test_cli_scores_a_history_column_in_jsonl_and_csv(server, tmp_path):
    import csv

    rows = [
        {"question": QUESTION, "answer": ANSWER, "history": HISTORY},
        {"question": "What is the capital of France?", "answer": "Paris is the capital of France."},
        {"question": QUESTION, "answer": ANSWER, "history": "not json ["},
    ]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    csv_path = tmp_path / "rows.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["question", "answer", "history"])
        writer.writeheader()
        for r in rows:
            history = r.get("history")
            writer.writerow({**r, "history": json.dumps(history) if isinstance(history, list) else (history or "")})
    env = subprocess_env(fake_model_env(server), RELEVANCY_TRACER_METHOD="ragas_judge_intent")
    for path in (jsonl, csv_path):
        out = tmp_path / f"{path.stem}-{path.suffix[1:]}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "relevancy_tracer.cli", "score", str(path), "-o", str(out), "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        results = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["status"] for r in results] == ["scored"] * 3, path
        assert results[0]["history_status"] == "read" and results[0]["history_turns"] == 2 and results[0]["standalone_question"].startswith(QUESTION)
        assert results[1]["history_status"] is None and results[1]["standalone_question"] is None
        assert results[2]["history_status"] == "invalid"


# ------------------------------------------------------------------------- serve's jobs


def test_a_fleet_job_carries_the_bounded_history_and_refuses_a_malformed_one():
    from relevancy_tracer.service.jobs import ScoreRequest
    from relevancy_tracer.service.otlp import ReceivedSpan
    from relevancy_tracer.service.selection import Candidate

    span = ReceivedSpan(trace_id="1" * 32, span_id="2" * 16, parent_span_id="", name="chat", kind=1, attributes={})
    long_history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "y" * 3000} for i in range(40)]
    request = ScoreRequest.from_candidate(Candidate(span, QUESTION, ANSWER, history=long_history), "ragas_judge_intent", 2000, 6000, 4, 5000)
    assert len(request.history) <= 4 and sum(len(t["content"]) for t in request.history) <= 5000
    assert request.history[-1]["content"].startswith("turn 39")
    again = ScoreRequest.from_json(request.to_json())
    assert again.history == request.history
    single = ScoreRequest.from_candidate(Candidate(span, QUESTION, ANSWER), "ragas_judge_intent", 2000, 6000)
    assert single.history is None and ScoreRequest.from_json(single.to_json()).history is None
    for bad in ("text", [{"role": "system", "content": "x"}], [{"role": "user", "content": 1}], [{"role": "user", "content": "x", "extra": 1}]):
        payload = json.loads(request.to_json())
        payload["history"] = bad
        with pytest.raises(ValueError, match="history"):
            ScoreRequest.from_json(json.dumps(payload))
