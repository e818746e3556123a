"""Which received spans to score, and their question, answer and contexts.

A span is a candidate when it carries a question and an answer in one of the conventions apps
are instrumented with, each read by its own rules (the question is the user's last turn, never
a system, tool or assistant message, a model name or a template; the answer is the reply text):

* **OpenInference** (Phoenix; the OpenInference instrumentations of OpenAI, LangChain,
  LlamaIndex, ...; ``@arizeai/openinference-vercel``): ``llm.input_messages.<i>.message.role`` /
  ``.content`` / ``.contents.<j>.message_content.text`` (the last user message) and
  ``llm.output_messages.<i>...`` (the assistant's text); else ``input.value`` / ``output.value``:
  plain text, or JSON of a known shape (:func:`question_of`, :func:`answer_of`: an OpenAI chat
  request and response, ``{"system", "messages"}``, a chain's ``{"question": ...}`` inputs...).
* **Vercel AI SDK** ``experimental_telemetry`` (``ai.generateText`` / ``ai.streamText`` and their
  ``.doGenerate`` / ``.doStream`` calls): ``ai.prompt`` / ``ai.prompt.messages`` and
  ``ai.response.text``.
* **Langfuse** (its SDK's OpenTelemetry export): ``langfuse.observation.input`` / ``.output``.
* **Traceloop** (``traceloop-sdk``'s ``@workflow`` and ``@agent`` decorators, whose spans carry
  ``traceloop.span.kind``): ``traceloop.entity.input`` / ``.output`` (JSON of the function's
  ``{"args", "kwargs"}`` and its return value). Its ``@task`` and ``@tool`` spans are steps of
  one, not calls; the LLM calls inside carry GenAI attributes (below).
* **MLflow** (``mlflow-tracing``'s OTLP export): ``mlflow.spanInputs`` / ``mlflow.spanOutputs``
  by ``mlflow.spanType`` (tools, retrievers and the like are steps, not calls).
* **GenAI content events on the span** (Strands Agents): ``gen_ai.user.message`` /
  ``gen_ai.choice`` or ``gen_ai.client.inference.operation.details`` span events, read as the
  log events of ``join.py`` are.
* **GenAI semantic conventions**: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON
  ``[{"role": "user", "parts": [{"type": "text", "content": "..."}]}]``): the question is the last
  user message's text parts, the answer the assistant messages' text parts; and the older
  ``gen_ai.prompt`` / ``gen_ai.completion`` (a string, JSON messages, or OpenLLMetry's indexed
  ``gen_ai.prompt.<i>.role`` / ``.content``).

A JSON value of no known shape yields nothing (reason ``unknown_json``): nothing is guessed. A
span that looks like a call (an OpenInference kind, a Vercel AI SDK generation, a Langfuse
generation, agent or chain, a Traceloop workflow or agent) but yields no question or answer is
:class:`Skipped` with its source and reason, for the service to count. Each attribute value is parsed at most once and
walked along known keys only: the CPU cost is linear in the span's size whatever its nesting.

A GenAI inference span (``gen_ai.operation.name`` chat, text_completion or generate_content;
OpenLLMetry's ``llm.request.type`` chat or completion without ``gen_ai.operation.name``) without
content on it is *pending*: its messages come as log events, which ``join.py`` joins to it.

Filters (all configurable): OpenInference span kinds (default CHAIN, AGENT and LLM; spans
without a kind qualify through the other conventions), span-name glob patterns, required
attribute values, and by default only the outermost candidate of each trace (a LangChain request
produces many nested CHAIN spans; the root one holds the user's question and the final answer):
within one batch here (:meth:`SpanSelector.partition`), across export requests in the service's
decision window (``decision.py``). Spans this package wrote (EVALUATOR spans, spans already
carrying ``relevancy.status``) are never candidates. Then the decorator's samplers: the
trace-id ratio (every service of a trace decides alike) and the rate limit.

Contexts come from ``retrieval.documents.<i>.document.content`` on the span, else on RETRIEVER
spans of the same trace. Where the question comes from chat messages, the conversation's earlier
user and assistant turns come with it (:attr:`Candidate.history`).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..otel import attributes as A
from ..tracing.sampling import RateLimitSampler, TraceIdRatioSampler
from .join import events_content
from .messages import content_text, load_json, message_texts, read_message, read_messages
from .otlp import ReceivedSpan

QUESTION_FIELDS = ("question", "query", "input", "user_input", "prompt", "q", "message", "query_str", "task")
ANSWER_FIELDS = ("answer", "output", "result", "response", "text", "content", "output_text")
_DOCUMENT = re.compile(r"^retrieval\.documents\.(\d+)\.document\.content$")
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(role|content)$")
_OI_MESSAGE = re.compile(r"(\d+)\.(message\..+)$")
_OI_PART = re.compile(r"(\d+)\.message_content\.(type|text)$")
#: ``gen_ai.operation.name`` values of inference calls whose content may come as log events.
INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
#: ``gen_ai.response.finish_reasons`` of a reply that calls tools.
TOOL_FINISH_REASONS = frozenset({"tool_calls", "tool_call", "tool_use", "function_call"})
#: ``gen_ai.operation.name`` values of steps of an agent, not calls: a tool's execution.
GENAI_STEPS = frozenset({"execute_tool"})
#: OpenLLMetry's ``llm.request.type`` of inference calls (its events mode sends the content as
#: log events, and older versions set no ``gen_ai.operation.name``).
LLM_REQUEST_TYPES = frozenset({"chat", "completion"})
LANGFUSE_INPUT = "langfuse.observation.input"
LANGFUSE_OUTPUT = "langfuse.observation.output"
LANGFUSE_TYPE = "langfuse.observation.type"
#: Langfuse observation types that are calls (a span without input and output is not one).
LANGFUSE_CALLS = frozenset({"generation", "agent", "chain"})
TRACELOOP_INPUT = "traceloop.entity.input"
TRACELOOP_OUTPUT = "traceloop.entity.output"
TRACELOOP_KIND = "traceloop.span.kind"
#: Traceloop span kinds that are calls: an ``@workflow`` or ``@agent`` function (a ``task`` or
#: ``tool`` is a step of one: a tool's input is its arguments, not the user's question).
TRACELOOP_CALLS = frozenset({"workflow", "agent"})
MLFLOW_INPUTS = "mlflow.spanInputs"
MLFLOW_OUTPUTS = "mlflow.spanOutputs"
MLFLOW_TYPE = "mlflow.spanType"
#: MLflow span types that are steps of a call, not calls (a tool's input is its arguments, a
#: retriever's a query it was given).
MLFLOW_STEPS = frozenset({"TOOL", "RETRIEVER", "EMBEDDING", "PARSER", "RERANKER", "MEMORY"})

#: Conventions a span is read by (``relevancy.source`` of the skipped counter).
SOURCES = ("openinference", "vercel_ai", "langfuse", "traceloop", "genai", "mlflow")
# skip reasons (``relevancy.reason`` of ``relevancy.service.skipped``)
UNKNOWN_JSON = "unknown_json"  # a JSON value with no field this module knows
INVALID_JSON = "invalid_json"  # declared JSON (mime type), not parseable
TOO_DEEP = "too_deep"  # nested past the JSON parser's limit
PYTHON_REPR = "python_repr"  # a Python object's repr (a prompt template, a message list), not text
NO_INPUT = "no_input"  # no input.value, llm.input_messages
NO_QUESTION = "no_question"
NO_USER_MESSAGE = "no_user_message"  # chat messages without a user turn
NO_ANSWER = "no_answer"
TOOL_CALL = "tool_call"  # the reply only calls tools
#: the app records no content: a Traceloop workflow or agent without ``traceloop.entity.input``
#: and ``.output`` (``TRACELOOP_TRACE_CONTENT=false``; with it on, traceloop-sdk always writes
#: the input, its JSON encoder falling back to class names)
CONTENT_NOT_CAPTURED = "content_not_captured"
#: a known framework's step, not a call (an MLflow TOOL, RETRIEVER, EMBEDDING... span)
STEP = "step"
SKIP_REASONS = (
    UNKNOWN_JSON,
    INVALID_JSON,
    TOO_DEEP,
    PYTHON_REPR,
    NO_INPUT,
    NO_QUESTION,
    NO_USER_MESSAGE,
    NO_ANSWER,
    TOOL_CALL,
    CONTENT_NOT_CAPTURED,
    STEP,
)
# verdicts of SpanSelector.read
CANDIDATE, PENDING, SKIPPED, IGNORED = "candidate", "pending", "skipped", "ignored"


@dataclass(frozen=True)
class Selection:
    """What the service scores.

    Attributes:
        span_kinds: OpenInference kinds accepted (``openinference.span.kind``).
        names: glob patterns of span names (empty: any).
        attributes: required attribute values (``key -> value`` compared as strings).
        outermost_only: only the outermost candidate of each trace in a batch.
        sample_ratio: share of traces scored, decided on the trace id (as the decorator).
        rate_limit: evaluations per minute at most (None: no cap).
        max_contexts, max_context_chars: caps on the contexts taken.
    """

    span_kinds: tuple[str, ...] = ("CHAIN", "AGENT", "LLM")
    names: tuple[str, ...] = ()
    attributes: tuple[tuple[str, str], ...] = ()
    outermost_only: bool = True
    sample_ratio: float = 1.0
    rate_limit: Optional[float] = None
    max_contexts: int = 16
    max_context_chars: int = 32000


@dataclass
class Candidate:
    """A span to score: where it is, and its texts."""

    span: ReceivedSpan
    question: str
    answer: str
    contexts: Optional[list[str]] = None
    convention: str = "openinference"
    #: the conversation's earlier turns, oldest first: ``{"role": "user" | "assistant",
    #: "content": str}`` before the last user turn (system and tool messages dropped); empty
    #: for a single turn or a source without messages
    history: list[dict] = field(default_factory=list)


class Unreadable(Exception):
    """A value that holds no question or answer in any form this module knows; ``reason`` is
    the counted skip reason (:data:`UNKNOWN_JSON`, :data:`INVALID_JSON`, :data:`NO_USER_MESSAGE`,
    :data:`TOOL_CALL`, ...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _parse(text: str, declared_json: bool) -> Any:
    """``text`` parsed as JSON once (C parser: linear in its length); a text that is not JSON
    is itself unless its mime type declared JSON. Nesting past the parser's recursion limit
    is :data:`TOO_DEEP`."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Unreadable(TOO_DEEP) from None
    except ValueError:
        if declared_json:
            raise Unreadable(PYTHON_REPR if _PYTHON_REPR.match(text) else INVALID_JSON) from None
        return text


_JSON_START = re.compile(r"\s*[\[{]")
#: LangGraph's routing targets (``__end__``, ``__start__``): what a conditional edge returns.
_ROUTING = re.compile(r"__[a-z_]+__$")
#: The repr of a Python object that instrumentations put where JSON failed: a dict or list repr
#: (``{'template': ...``), or a class's (``PromptTemplate(...)``, ``ChatMessage(role=...``).
_PYTHON_REPR = re.compile(r"\s*(?:[\[{]\s*'|[A-Z][A-Za-z]*(?:Template|Message|Bundle|Node|Prompt)\w*\()")


def _looks_json(text: str) -> bool:
    return _JSON_START.match(text) is not None


def last_user_text(messages: list[tuple[str, Optional[str], bool]]) -> str:
    """The last user message's text (the user's turn; system, tool and assistant messages never
    are). Raises Unreadable(no_user_message)."""
    for role, text, _ in reversed(messages):
        if role == "user" and text and text.strip():
            return text
    raise Unreadable(NO_USER_MESSAGE)


def history_of(messages: list[tuple[str, Optional[str], bool]]) -> list[dict]:
    """The conversation's earlier turns: the user and assistant messages with text before the
    last user message, oldest first, as ``{"role", "content"}`` (system and tool messages and
    tool calls without text dropped); empty for a single turn."""
    last = max(
        (i for i, (role, text, _) in enumerate(messages) if role == "user" and text and text.strip()), default=-1
    )
    return [
        {"role": role, "content": text}
        for role, text, _ in messages[: max(last, 0)]
        if role in ("user", "assistant") and text and text.strip()
    ]


#: Fields beside a question that hold the conversation's earlier turns as chat messages
#: (LlamaIndex's chat engines: ``{"message", "chat_history"}``; a LangChain prompt's
#: ``{"question", "history"}`` variables)
HISTORY_FIELDS = ("chat_history", "history")


def sibling_history(value: dict) -> list[dict]:
    """The earlier turns in a :data:`HISTORY_FIELDS` field of chat messages beside the
    question (every user and assistant message with text: they all precede it); empty when
    there is none."""
    for name in HISTORY_FIELDS:
        messages = read_messages(value.get(name))
        if messages:
            return [{"role": role, "content": text} for role, text, _ in messages if role in ("user", "assistant") and text and text.strip()]
    return []


def assistant_text(messages: list[tuple[str, Optional[str], bool]]) -> str:
    """The assistant's reply text (every assistant or role-less message's text, joined).
    Raises Unreadable(tool_call) when it only calls tools, Unreadable(no_answer) otherwise."""
    texts = [text for role, text, _ in messages if role in ("assistant", "") and text and text.strip()]
    if texts:
        return "".join(texts)
    raise Unreadable(TOOL_CALL if any(tool for _, _, tool in messages) else NO_ANSWER)


def _last_turn(messages: list[tuple[str, Optional[str], bool]], turns: Optional[list]) -> str:
    """:func:`last_user_text`, the earlier turns put in ``turns`` (when a list)."""
    question = last_user_text(messages)
    if turns is not None:
        turns[:] = history_of(messages)
    return question


def question_of(value: Any, depth: int = 0, turns: Optional[list] = None) -> str:
    """The user's question in a parsed input value, by known shape only:

    * a string: itself, unless it is a Python object's repr (a prompt template, ``{'...``:
      what an instrumentation records when the value is not JSON): Unreadable(python_repr);
    * a list of chat messages: the last user message (never a system, tool or assistant one);
    * an object: the string field named question | query | input | user_input | prompt | q |
      message (LlamaIndex's chat engines) | query_str;
      ``messages`` (an OpenAI chat request, the Vercel AI SDK's ``{"system", "messages"}``,
      LangChain's chat model input): the last user message; ``prompt`` as a message list;
      ``input`` / ``inputs`` / ``kwargs`` (LangChain chains, OpenLLMetry's LangChain
      ``{"inputs", "tags", "metadata", "kwargs"}``, Langfuse's ``@observe`` inputs) one level
      down, ``inputs`` also as a string (a chain invoked with one); Langfuse's ``{"args": [one
      argument]}`` (a string or chat messages).

    With ``turns`` (a list), the conversation's earlier turns are put in it when the question
    comes from chat messages (:func:`history_of`). Anything else raises
    Unreadable(unknown_json): nothing is guessed from "the only string field" (the system
    prompt and model names are strings too). Walks at most 4 levels of
    known keys: the cost is linear in the value's size.
    """
    if isinstance(value, str):
        if _PYTHON_REPR.match(value):
            raise Unreadable(PYTHON_REPR)
        if value.strip():
            return value
        raise Unreadable(NO_QUESTION)
    messages = read_messages(value)
    if messages is not None:
        return _last_turn(messages, turns)
    if isinstance(value, dict) and depth < 4:
        for name in QUESTION_FIELDS:
            field_value = value.get(name)
            if isinstance(field_value, str) and field_value.strip():
                question = question_of(field_value, depth + 1, turns)  # a repr is refused there
                if turns is not None:
                    turns[:] = sibling_history(value)
                return question
        for name in ("messages", "prompt"):
            messages = read_messages(value.get(name))
            if messages is not None:
                return _last_turn(messages, turns)
        if isinstance(value.get("inputs"), str):  # a chain invoked with a string
            return question_of(value["inputs"], depth + 1, turns)
        for name in ("input", "inputs", "kwargs"):
            if isinstance(value.get(name), (dict, list)):
                try:
                    return question_of(value[name], depth + 1, turns)
                except Unreadable as exc:
                    if exc.reason != UNKNOWN_JSON:
                        raise
        args = value.get("args")
        if isinstance(args, list) and len(args) == 1 and not value.get("kwargs") and isinstance(args[0], (str, list)):
            return question_of(args[0], depth + 1, turns)  # a function of one argument: a question or messages
    raise Unreadable(UNKNOWN_JSON)


def answer_of(value: Any, depth: int = 0) -> str:
    """The reply text in a parsed output value, by known shape only:

    * a string: itself;
    * an OpenAI chat completion (``choices[0].message.content``; ``choices[0].text`` for text
      completions), a Responses API response (``output_text``, or the ``output_text`` parts
      of its ``output`` messages), LangChain's ``generations[0][0]``;
    * a chat message or a list of them (the assistant's text), LangChain's serialised message
      (``{"lc": 1, "type": "constructor", "id": [..., "AIMessage"], "kwargs": {"content"}}``,
      its ``to_json()``); ``messages`` (LangGraph's state): the last assistant message;
    * an object with a string field named answer | output | result | response | text |
      content | output_text; ``output`` / ``result`` / ``message`` / ``outputs`` one level
      down (``outputs``: a chain's outputs, as OpenLLMetry's LangChain instrumentation writes
      them, also a string).

    Anything else raises Unreadable(unknown_json); a reply that only calls tools
    Unreadable(tool_call). Linear in the value's size.
    """
    if isinstance(value, str):
        if _ROUTING.match(value):
            raise Unreadable(NO_ANSWER)  # a graph's routing decision (LangGraph's "__end__"), not a reply
        if value.strip():
            return value
        raise Unreadable(NO_ANSWER)
    if (
        isinstance(value, list)
        and value
        and isinstance(value[-1], dict)
        and value[-1].get("object") == "response"
        and depth < 4
    ):
        return answer_of(value[-1], depth + 1)  # Responses API responses (OpenAI Agents' spans): the last
    messages = read_messages(value)
    if messages is not None:
        return assistant_text(messages)
    if isinstance(value, dict) and depth < 4:
        choices = value.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            first = choices[0]
            if isinstance(first.get("message"), dict):
                return assistant_text([read_message({"role": "assistant", **first["message"]}) or ("assistant", None, False)])
            if isinstance(first.get("text"), str) and first["text"].strip():
                return first["text"]
            raise Unreadable(NO_ANSWER)
        if isinstance(value.get("output"), list):
            texts = [text for item in value["output"] if isinstance(item, dict) and item.get("type", "message") == "message" for text in [content_text(item.get("content"))] if text]
            if texts:
                return "".join(texts)
            if value.get("object") == "response":  # a Responses API response without text
                calls = any(
                    isinstance(item, dict) and str(item.get("type", "")).endswith("call") for item in value["output"]
                )
                raise Unreadable(TOOL_CALL if calls else NO_ANSWER)
        generations = value.get("generations")
        if isinstance(generations, list) and generations:
            first = generations[0][0] if isinstance(generations[0], list) and generations[0] else generations[0]
            if isinstance(first, dict) and isinstance(first.get("text"), str) and first["text"].strip():
                return first["text"]
        if "role" in value and ("content" in value or "parts" in value):
            found = read_message(value)
            if found is not None:
                return assistant_text([found])
        if value.get("type") == "constructor" and isinstance(value.get("kwargs"), dict):  # LangChain's to_json()
            found = read_message(value)
            if found is not None and found[0] in ("assistant", ""):
                return assistant_text([found])
        if isinstance(value.get("outputs"), str):  # a chain ending in a string (StrOutputParser)
            return answer_of(value["outputs"], depth + 1)
        for name in ANSWER_FIELDS:
            field_value = value.get(name)
            if isinstance(field_value, str) and field_value.strip():
                return field_value
        messages = read_messages(value.get("messages"))
        if messages is not None:  # a graph's state: its last message is the reply, if the assistant's
            role, text, tool = messages[-1]
            if role == "assistant" and text and text.strip():
                return text
            raise Unreadable(TOOL_CALL if role == "assistant" and tool else NO_ANSWER)
        for name in ("output", "result", "message", "outputs"):
            if isinstance(value.get(name), (dict, list)):
                try:
                    return answer_of(value[name], depth + 1)
                except Unreadable as exc:
                    if exc.reason != UNKNOWN_JSON:
                        raise
    raise Unreadable(UNKNOWN_JSON)


def _value(attributes: dict[str, Any], key: str, mime_key: Optional[str] = None, serialised: bool = False) -> Any:
    """An attribute as a Python value: strings holding JSON parsed (when the mime type says
    JSON, the text starts like JSON, or the source always serialises its values as JSON:
    ``serialised``, as Langfuse does), others as they are. Raises Unreadable when absent."""
    raw = attributes.get(key)
    if raw is None:
        raise Unreadable(NO_QUESTION if "input" in key or "prompt" in key else NO_ANSWER)
    if not isinstance(raw, str):
        return raw
    declared = "json" in str(attributes.get(mime_key, "")) if mime_key else False
    return _parse(raw, declared) if declared or serialised or _looks_json(raw) else raw


def _indexed_messages(attributes: dict[str, Any]) -> dict[str, list[tuple[str, Optional[str], bool]]]:
    """OpenInference's flattened messages ``llm.input_messages.<i>.message.role`` / ``.content``
    / ``.contents.<j>.message_content.type|text`` / ``.tool_calls.<k>...`` (and the same under
    ``llm.output_messages``), in index order, by prefix; one pass over the attributes."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for key, value in attributes.items():
        if not key.startswith("llm."):
            continue
        if key.startswith("llm.input_messages."):
            prefix = "llm.input_messages"
        elif key.startswith("llm.output_messages."):
            prefix = "llm.output_messages"
        else:
            continue
        match = _OI_MESSAGE.match(key, len(prefix) + 1)
        if match is None:
            continue
        entry = found.setdefault(prefix, {}).setdefault(int(match.group(1)), {"parts": {}})
        field_name = match.group(2)
        if field_name == "message.role":
            entry["role"] = value
        elif field_name == "message.content":
            entry["content"] = value
        elif field_name.startswith("message.contents."):
            part = _OI_PART.match(field_name, len("message.contents."))
            if part is not None:
                entry["parts"].setdefault(int(part.group(1)), {})[part.group(2)] = value
        elif field_name.startswith("message.tool_calls."):
            entry["tool"] = True
    out = {}
    for prefix, entries in found.items():
        messages = []
        for _, entry in sorted(entries.items()):
            text = entry.get("content") if isinstance(entry.get("content"), str) else None
            if text is None and entry["parts"]:
                text = "".join(p["text"] for _, p in sorted(entry["parts"].items()) if p.get("type", "text") == "text" and isinstance(p.get("text"), str)) or None
            role = str(entry.get("role") or "").lower()
            messages.append(({"human": "user", "ai": "assistant"}.get(role, role), text, bool(entry.get("tool"))))
        out[prefix] = messages
    return out


def openinference_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> tuple[str, str]:
    """(question, answer) of an OpenInference span: ``llm.input_messages`` (the last user
    message) else ``input.value``; ``llm.output_messages`` (the assistant's text) else
    ``output.value`` (an OpenAI request / response JSON, a chain's inputs / outputs, or
    plain text; see :func:`question_of`, :func:`answer_of`; a CHAIN's or AGENT's ``input.value``
    comes first when it reads); the earlier turns into ``turns``.
    Raises Unreadable."""
    indexed = _indexed_messages(attributes)
    messages, outputs = indexed.get("llm.input_messages"), indexed.get("llm.output_messages")
    question = None
    if (
        messages is not None
        and A.INPUT_VALUE in attributes
        and attributes.get(A.OPENINFERENCE_SPAN_KIND) in ("CHAIN", "AGENT")
    ):
        # a chain's or agent's input.value holds its whole input; the LangChain instrumentation's
        # llm.input_messages on a LangGraph chain hold only the state's first message
        try:
            question = question_of(_value(attributes, A.INPUT_VALUE, "input.mime_type"), turns=turns)
        except Unreadable:
            question = None
    if question is None:
        question = (
            _last_turn(messages, turns)
            if messages is not None
            else question_of(_value(attributes, A.INPUT_VALUE, "input.mime_type"), turns=turns)
        )
    answer = assistant_text(outputs) if outputs is not None else answer_of(_value(attributes, A.OUTPUT_VALUE, "output.mime_type"))
    return question, answer


def vercel_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> tuple[str, str]:
    """(question, answer) of a Vercel AI SDK span (``experimental_telemetry``):
    ``ai.prompt.messages`` (provider-level ``doGenerate`` / ``doStream`` spans) or ``ai.prompt``
    (``{"system", "prompt" | "messages"}`` on ``ai.generateText`` / ``ai.streamText``): the
    last user message or the prompt string, never ``system``; the answer ``ai.response.text``.
    Raises Unreadable."""
    if "ai.prompt.messages" in attributes:
        question = question_of(_value(attributes, "ai.prompt.messages"), turns=turns)
    else:
        prompt = _value(attributes, "ai.prompt")
        question = question_of(
            prompt if not isinstance(prompt, dict) else {k: v for k, v in prompt.items() if k != "system"}, turns=turns
        )
    text = attributes.get("ai.response.text")
    if not isinstance(text, str) or not text.strip():
        raise Unreadable(TOOL_CALL if attributes.get("ai.response.toolCalls") else NO_ANSWER)
    return question, text


def langfuse_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> tuple[str, str]:
    """(question, answer) of a span exported by the Langfuse SDK: ``langfuse.observation.input``
    / ``.output`` (JSON: a generation's chat messages and reply message, or an ``@observe``
    function's ``{"args", "kwargs"}`` and return value). Raises Unreadable."""
    return question_of(_value(attributes, LANGFUSE_INPUT, serialised=True), turns=turns), answer_of(
        _value(attributes, LANGFUSE_OUTPUT, serialised=True)
    )


def traceloop_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> tuple[str, str]:
    """(question, answer) of a Traceloop ``@workflow`` or ``@agent`` span (``traceloop-sdk``):
    ``traceloop.entity.input`` (JSON ``{"args": [...], "kwargs": {...}}``: a function of one
    argument, a question or chat messages, whose last user turn is the question; a method's
    ``self`` before it is dropped, :func:`without_self`) and ``traceloop.entity.output`` (JSON
    of the return value: text, a chat completion, a message). Raises Unreadable."""
    value = without_self(_value(attributes, TRACELOOP_INPUT, serialised=True), str(attributes.get("traceloop.entity.name") or ""))
    return question_of(value, turns=turns), answer_of(_value(attributes, TRACELOOP_OUTPUT, serialised=True))


def mlflow_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> tuple[str, str]:
    """(question, answer) of an MLflow span (``mlflow-tracing``'s OTLP export):
    ``mlflow.spanInputs`` / ``mlflow.spanOutputs``, JSON of a traced function's arguments by name
    (``{"messages": [...]}``, ``{"question": ...}``) or of an autologged client call's request
    (an OpenAI chat request: the last user message) and its return value (text, a chat
    completion, a message). Raises Unreadable."""
    return question_of(_value(attributes, MLFLOW_INPUTS, serialised=True), turns=turns), answer_of(
        _value(attributes, MLFLOW_OUTPUTS, serialised=True)
    )


def without_self(value: Any, entity_name: str) -> Any:
    """A Traceloop method's input without its ``self``: ``{"args": [self, x]}`` -> ``{"args":
    [x]}`` when the first argument is unambiguously the instance. traceloop-sdk's JSON encoder
    writes an object it cannot serialise as its class name (``"Assistant"``), and an unnamed
    decorator's entity name is the method's ``__qualname__`` (``Assistant.answer``). So the
    first argument is ``self`` when it is that class name, or, under a named decorator (no class
    in the name), a CapWords identifier followed by a chat message list. Any other value is
    returned as it is (a function of two arguments is not guessed from). An instance the
    encoder serialises (a dataclass, a pydantic model: a JSON object) is not recognised."""
    if not isinstance(value, dict) or value.get("kwargs"):
        return value
    args = value.get("args")
    if not isinstance(args, list) or len(args) != 2 or not isinstance(args[0], str) or not args[0].isidentifier():
        return value
    first, second = args
    owner = entity_name.split(".")[-2] if "." in entity_name else None
    if first == owner or (first[:1].isupper() and read_messages(second) is not None):
        return {"args": [second], "kwargs": {}}
    return value


def _genai_messages(value: Any) -> list[tuple[str, Optional[str], bool]]:
    return [m for m in (read_message(item) for item in value) if m is not None] if isinstance(value, list) else []


def genai_texts(attributes: dict[str, Any], turns: Optional[list] = None) -> Optional[tuple[str, str]]:
    """(question, answer) from GenAI semantic-convention attributes, or None; the earlier turns
    into ``turns``. Raises Unreadable(tool_call) when the output messages only call tools."""
    question = answer = None
    if "gen_ai.input.messages" in attributes:
        inputs = _genai_messages(load_json(attributes["gen_ai.input.messages"]))
        users = [text for role, text, _ in inputs if role == "user" and text and text.strip()]
        question = users[-1] if users else None
        if question is not None and turns is not None:
            turns[:] = history_of(inputs)
    if "gen_ai.output.messages" in attributes:
        outputs = _genai_messages(load_json(attributes["gen_ai.output.messages"]))
        answer = (
            "".join(text for role, text, _ in outputs if role in ("assistant", "") and text and text.strip()) or None
        )
        if answer is None and any(tool for _, _, tool in outputs):
            raise Unreadable(TOOL_CALL)
    if question is None and "gen_ai.prompt" in attributes:
        prompt = load_json(attributes["gen_ai.prompt"])
        messages = _genai_messages(prompt)
        users = [text for role, text, _ in messages if role == "user" and text and text.strip()]
        question = users[-1] if users else (prompt if isinstance(prompt, str) else None)
        if users and turns is not None:
            turns[:] = history_of(messages)
    if answer is None and "gen_ai.completion" in attributes:
        completion = load_json(attributes["gen_ai.completion"])
        texts = message_texts(completion) if isinstance(completion, list) else []
        answer = "".join(t for _, t in texts) if texts else (completion if isinstance(completion, str) else None)
    if question is None or answer is None:
        indexed: dict[tuple[str, int], dict[str, Any]] = {}
        for key, value in attributes.items():
            match = _INDEXED.match(key)
            if match:
                indexed.setdefault((match.group(1), int(match.group(2))), {})[match.group(3)] = value
        if question is None:
            prompts = [
                (str(v.get("role") or ""), v["content"] if isinstance(v.get("content"), str) else None, False)
                for (kind, _), v in sorted(indexed.items())
                if kind == "prompt"
            ]
            users = [text for role, text, _ in prompts if role == "user" and text]
            question = users[-1] if users else None
            if users and turns is not None:
                turns[:] = history_of(prompts)
        if answer is None:
            completions = [v["content"] for (kind, _), v in sorted(indexed.items()) if kind == "completion" and isinstance(v.get("content"), str)]
            answer = "".join(completions) if completions else None
    if isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip():
        return question, answer
    if isinstance(question, str) and question.strip() and not (isinstance(answer, str) and answer.strip()):
        reasons = attributes.get("gen_ai.response.finish_reasons")
        reasons = reasons if isinstance(reasons, (list, tuple)) else [reasons]
        if any(str(reason).lower() in TOOL_FINISH_REASONS for reason in reasons):
            raise Unreadable(TOOL_CALL)  # content on the span, the reply a tool call (OpenLIT)
    return None


def span_documents(attributes: dict[str, Any]) -> list[str]:
    """``retrieval.documents.<i>.document.content`` values in index order."""
    found = []
    for key, value in attributes.items():
        match = _DOCUMENT.match(key)
        if match and isinstance(value, str):
            found.append((int(match.group(1)), value))
    return [text for _, text in sorted(found)]


@dataclass(frozen=True)
class Skipped:
    """A span that looks like an LLM, chain or agent call but yields no question or answer.

    Attributes:
        span: the span. source: the convention it was read by (:data:`SOURCES`).
        reason: why (:data:`SKIP_REASONS`).
    """

    span: ReceivedSpan
    source: str
    reason: str
    #: the span is an agent run (:func:`agent_run`): when it does not read, the last call
    #: inside it is the run's answer (``decision.py``)
    run: bool = False


def agent_run(span: ReceivedSpan) -> bool:
    """Whether ``span`` is an agent's run by its convention: an OpenInference AGENT, a GenAI
    ``invoke_agent``, an MLflow AGENT, a Traceloop or Langfuse agent."""
    attrs = span.attributes
    return (
        attrs.get(A.OPENINFERENCE_SPAN_KIND) == "AGENT"
        or attrs.get("gen_ai.operation.name") == "invoke_agent"
        or str(attrs.get(TRACELOOP_KIND) or "") == "agent"
        or str(attrs.get(LANGFUSE_TYPE) or "") == "agent"
        or (MLFLOW_TYPE in attrs and load_json(attrs.get(MLFLOW_TYPE)) == "AGENT")
    )


class SpanSelector:
    """Applies a :class:`Selection` to the spans of export requests (thread-safe)."""

    def __init__(self, selection: Selection = Selection()):
        self.selection = selection
        self._ratio = TraceIdRatioSampler(selection.sample_ratio)
        self._rate = RateLimitSampler(selection.rate_limit) if selection.rate_limit else None

    def passes(self, span: ReceivedSpan) -> bool:
        """Whether ``span`` passes the static filters (names, attributes, kinds; not this
        package's own spans)."""
        attrs = span.attributes
        if span.scope == "relevancy_tracer" or A.STATUS in attrs:
            return False  # written by this package (scored in-app, or an evaluator span)
        kind = attrs.get(A.OPENINFERENCE_SPAN_KIND)
        sel = self.selection
        if sel.names and not any(fnmatch.fnmatchcase(span.name, pattern) for pattern in sel.names):
            return False
        for key, expected in sel.attributes:
            if str(attrs.get(key)) != expected:
                return False
        return kind is None or (kind != A.SPAN_KIND_EVALUATOR and kind in sel.span_kinds)

    def awaits_content(self, span: ReceivedSpan) -> bool:
        """Whether ``span`` is a GenAI inference call (``gen_ai.operation.name`` chat,
        text_completion or generate_content; OpenLLMetry's ``llm.request.type`` chat or
        completion) passing the static filters whose question and answer are not on the span:
        its content may come as log events (``join.py``)."""
        return self.read(span)[0] == PENDING

    def _inference(self, span: ReceivedSpan) -> bool:
        attrs = span.attributes
        return (str(attrs.get("gen_ai.operation.name") or "") in INFERENCE_OPERATIONS or (str(attrs.get("llm.request.type") or "") in LLM_REQUEST_TYPES and "gen_ai.operation.name" not in attrs)) and self.passes(span)

    def read(self, span: ReceivedSpan) -> tuple[str, Any]:
        """How ``span`` reads: (:data:`CANDIDATE`, (question, answer, convention)),
        (:data:`PENDING`, None) for a GenAI inference call whose content may come as log
        events, (:data:`SKIPPED`, (source, reason)) for a span that looks like an LLM, chain or
        agent call (an OpenInference kind, a Vercel AI SDK ``ai.generateText`` / ``ai.streamText``
        call, a Langfuse generation, agent or chain, a Traceloop workflow or agent, an MLflow
        span, a GenAI span with content events) but yields no question or answer, or
        (:data:`IGNORED`, None). Each value is parsed once; the cost is linear in the span's
        attribute sizes, whatever their nesting. :meth:`read_turns` also gives the earlier turns."""
        verdict, value = self.read_turns(span)
        return (verdict, value[:3]) if verdict == CANDIDATE else (verdict, value)

    def read_turns(self, span: ReceivedSpan) -> tuple[str, Any]:
        """:meth:`read`, a candidate's value with a fourth item: the conversation's earlier turns
        (``[{"role": "user" | "assistant", "content"}]``, oldest first; empty for one turn)."""
        attrs = span.attributes
        if not self.passes(span):
            return IGNORED, None
        source = None
        reason = UNKNOWN_JSON
        turns: list = []
        try:
            if attrs.get(A.OPENINFERENCE_SPAN_KIND) is not None:
                source = "openinference"
                if A.INPUT_VALUE in attrs or A.OUTPUT_VALUE in attrs or any(k.startswith("llm.input_messages.") for k in attrs):
                    try:
                        question, answer = openinference_texts(attrs, turns)
                        return CANDIDATE, (question, answer, "openinference", turns)
                    except Unreadable as exc:
                        reason = exc.reason
                else:
                    reason = NO_INPUT
            elif _vercel_call(span):
                source = "vercel_ai"
                question, answer = vercel_texts(attrs, turns)
                return CANDIDATE, (question, answer, "vercel_ai", turns)
            elif LANGFUSE_INPUT in attrs or LANGFUSE_OUTPUT in attrs or str(attrs.get(LANGFUSE_TYPE) or "") in LANGFUSE_CALLS:
                source = "langfuse"
                question, answer = langfuse_texts(attrs, turns)
                return CANDIDATE, (question, answer, "langfuse", turns)
            elif str(attrs.get(TRACELOOP_KIND) or "") in TRACELOOP_CALLS:
                source = "traceloop"
                if TRACELOOP_INPUT not in attrs and TRACELOOP_OUTPUT not in attrs:
                    raise Unreadable(CONTENT_NOT_CAPTURED)
                question, answer = traceloop_texts(attrs, turns)
                return CANDIDATE, (question, answer, "traceloop", turns)
            elif MLFLOW_TYPE in attrs or MLFLOW_INPUTS in attrs or MLFLOW_OUTPUTS in attrs:
                source = "mlflow"
                kind = load_json(attrs.get(MLFLOW_TYPE))
                if str(kind) in MLFLOW_STEPS:
                    raise Unreadable(STEP)
                if MLFLOW_INPUTS not in attrs and MLFLOW_OUTPUTS not in attrs:
                    raise Unreadable(NO_INPUT)
                question, answer = mlflow_texts(attrs, turns)
                return CANDIDATE, (question, answer, "mlflow", turns)
        except Unreadable as exc:
            reason = exc.reason
        except RecursionError:  # nested too deeply to hold a question or an answer
            reason = TOO_DEEP
        turns = []
        try:
            found = genai_texts(attrs, turns)
        except RecursionError:
            found = None
        except Unreadable as exc:  # the output messages only call tools: counted at once
            found = None
            if source is None:
                return SKIPPED, ("genai", exc.reason)
        if found is not None:
            return CANDIDATE, (found[0], found[1], "genai", turns)
        if span.events and source is None:

            if str(attrs.get("gen_ai.operation.name") or "") in GENAI_STEPS:
                return SKIPPED, ("genai", STEP)  # a tool's call and result are not a question and answer
            content = events_content(span)
            if content is not None:
                texts, why = content.outcome()
                if texts is not None:
                    return CANDIDATE, (texts[0], texts[1], "genai", content.history)
                return SKIPPED, ("genai", str(why))
        if self._inference(span):
            return PENDING, None
        if source is not None:
            return SKIPPED, (source, reason)
        return IGNORED, None

    def texts(self, span: ReceivedSpan) -> Optional[tuple[str, str, str]]:
        """(question, answer, convention) when ``span`` passes the static filters and holds
        them; else None."""
        verdict, value = self.read(span)
        return value if verdict == CANDIDATE else None

    def classify(self, spans: Sequence[ReceivedSpan]) -> tuple[list[Candidate], list[Skipped]]:
        """Every span of ``spans`` read once: the candidates (GenAI inference calls awaiting
        their content events included, convention ``genai-events`` with empty texts), and the
        spans that look like calls but yield nothing. No outermost choice, no sampling."""
        candidates, skipped = [], []
        for span in spans:
            verdict, value = self.read_turns(span)
            if verdict == CANDIDATE:
                candidates.append(Candidate(span, value[0], value[1], None, value[2], value[3]))
            elif verdict == PENDING:
                candidates.append(Candidate(span, "", "", None, "genai-events"))
            elif verdict == SKIPPED:
                skipped.append(Skipped(span, value[0], value[1], agent_run(span)))
        return candidates, skipped

    def sampled(self, candidate: Candidate) -> bool:
        """The decorator's samplers: the trace-id ratio, then the rate limit (consumes a token)."""
        if not self._ratio.sample_trace_id(_trace_number(candidate.span.trace_id)):
            return False
        return self._rate is None or self._rate.should_sample(None)  # type: ignore[arg-type]

    def select(self, spans: Sequence[ReceivedSpan]) -> list[Candidate]:
        """The candidates of one batch, filtered, outermost first, then sampled.

        Linear in the number of spans: each span's ancestry is walked once per batch (memoised)
        and each trace's RETRIEVER documents are collected once."""
        return self.partition(spans)[0]

    def partition(self, spans: Sequence[ReceivedSpan]) -> tuple[list[Candidate], list[Candidate]]:
        """(candidates, pending) of one batch: pending are GenAI inference spans whose content
        may come as log events (:meth:`awaits_content`; question and answer empty, convention
        ``genai-events``), filtered, outermost and sampled alike with the candidates."""
        candidates, _ = self.classify(spans)
        return self.choose(spans, candidates)

    def choose(self, spans: Sequence[ReceivedSpan], candidates: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """(candidates, pending) among ``candidates`` of the batch ``spans``: outermost per
        trace (when :attr:`Selection.outermost_only`), sampled, with their contexts."""
        sel = self.selection
        by_trace: dict[str, dict[str, ReceivedSpan]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, {})[span.span_id] = span
        if sel.outermost_only and candidates:
            chosen: dict[str, set[str]] = {}
            for candidate in candidates:
                chosen.setdefault(candidate.span.trace_id, set()).add(candidate.span.span_id)
            covered: dict[str, dict[str, bool]] = {}
            parents = {trace_id: {span_id: span.parent_span_id for span_id, span in trace.items()} for trace_id, trace in by_trace.items()}
            candidates = [c for c in candidates if not _covered(c.span.parent_span_id, parents.get(c.span.trace_id, {}), chosen[c.span.trace_id], covered.setdefault(c.span.trace_id, {}))]
        out = []
        retrieved: dict[str, list[str]] = {}
        for candidate in candidates:
            if not self.sampled(candidate):
                continue
            candidate.contexts = self._contexts(candidate.span, by_trace.get(candidate.span.trace_id, {}).values(), retrieved)
            out.append(candidate)
        return [c for c in out if c.convention != "genai-events"], [c for c in out if c.convention == "genai-events"]

    def _contexts(self, span: ReceivedSpan, trace_spans: Any, retrieved: dict[str, list[str]]) -> Optional[list[str]]:
        from ..tracing.extraction import cap_contexts

        documents = span_documents(span.attributes)
        if not documents:
            if span.trace_id not in retrieved:  # once per trace and batch
                retrieved[span.trace_id] = [text for other in trace_spans if other.attributes.get(A.OPENINFERENCE_SPAN_KIND) == "RETRIEVER" for text in span_documents(other.attributes)]
            documents = retrieved[span.trace_id]
        return cap_contexts(documents, self.selection.max_contexts, self.selection.max_context_chars) if documents else None


def _vercel_call(span: ReceivedSpan) -> bool:
    """A Vercel AI SDK text generation span: ``ai.generateText`` / ``ai.streamText`` or their
    provider calls ``.doGenerate`` / ``.doStream`` (``ai.operationId``, else the span name)."""
    operation = span.attributes.get("ai.operationId") or span.name
    return isinstance(operation, str) and operation.split(".")[:2] in (["ai", "generateText"], ["ai", "streamText"])


def _trace_number(trace_id: str) -> int:
    try:
        return int(trace_id, 16)
    except ValueError:
        return 0


def _covered(span_id: str, parents: dict[str, str], chosen: set[str], memo: dict[str, bool]) -> bool:
    """Whether ``span_id`` or one of its ancestors in ``parents`` (span id -> parent id) is in
    ``chosen``; every span on the walked path is memoised, so all the walks of a batch take
    linear time together. A parent cycle (malformed input) ends the walk as not covered."""
    path = []
    on_path = set()
    node = span_id
    result = False
    while node:
        if node in memo:
            result = memo[node]
            break
        if node in chosen:
            result = True
            break
        if node in on_path or node not in parents:
            break
        on_path.add(node)
        path.append(node)
        node = parents[node]
    for visited in path:
        memo[visited] = result
    return result
