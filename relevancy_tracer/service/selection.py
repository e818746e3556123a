"""Which received spans to score, and their question, answer and contexts.

A span is a candidate when it carries a question and an answer in one of the conventions apps
are instrumented with:

* **OpenInference** (Phoenix, OpenInference instrumentations of LangChain, LlamaIndex, ...):
  ``input.value`` / ``output.value``; when ``input.mime_type`` / ``output.mime_type`` is JSON,
  the question is the string field named question | query | input | user_input | prompt (or the
  only string field), the answer the field named answer | output | result | response | text.
* **GenAI semantic conventions**: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON
  ``[{"role": "user", "parts": [{"type": "text", "content": "..."}]}]``): the question is the last
  user message's text parts, the answer the assistant messages' text parts; and the older
  ``gen_ai.prompt`` / ``gen_ai.completion`` (a string, JSON messages, or OpenLLMetry's indexed
  ``gen_ai.prompt.<i>.role`` / ``.content``).

A GenAI inference span (``gen_ai.operation.name`` chat, text_completion or generate_content)
without content on it is *pending*: OpenTelemetry's own GenAI instrumentations send its
messages as log events, which ``join.py`` joins to it (:meth:`SpanSelector.partition`).

Filters (all configurable): OpenInference span kinds (default CHAIN, AGENT and LLM; spans
without a kind qualify through the GenAI attributes), span-name glob patterns, required
attribute values, and by default only the outermost candidate of each trace in the batch (a
LangChain request produces many nested CHAIN spans; the root one holds the user's question and
the final answer). Spans this package wrote (EVALUATOR spans, spans already carrying
``relevancy.status``) are never candidates. Then the decorator's samplers: the trace-id ratio
(every service of a trace decides alike) and the rate limit.

Contexts come from ``retrieval.documents.<i>.document.content`` on the span, else on RETRIEVER
spans of the same trace in the batch.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..otel import attributes as A
from ..tracing.sampling import RateLimitSampler, TraceIdRatioSampler
from .otlp import ReceivedSpan

QUESTION_FIELDS = ("question", "query", "input", "user_input", "prompt", "q")
ANSWER_FIELDS = ("answer", "output", "result", "response", "text", "content", "output_text")
_DOCUMENT = re.compile(r"^retrieval\.documents\.(\d+)\.document\.content$")
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(role|content)$")
#: ``gen_ai.operation.name`` values of inference calls whose content may come as log events.
INFERENCE_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})


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


def _json_field(text: str, fields: Sequence[str]) -> Optional[str]:
    try:
        value = json.loads(text)
    except RecursionError:  # nested too deeply to be a question or an answer
        return None
    except ValueError:
        return text
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for name in fields:
            if isinstance(value.get(name), str) and value[name].strip():
                return value[name]
        strings = [v for v in value.values() if isinstance(v, str) and v.strip()]
        if len(strings) == 1:
            return strings[0]
        # LangChain-style {"messages": [...]} or {"input": {...}}
        for nested in value.values():
            if isinstance(nested, (dict, list)):
                found = _json_field(json.dumps(nested), fields)
                if found and found != json.dumps(nested):
                    return found
        return None
    if isinstance(value, list):
        messages = _message_texts(value)
        if messages:
            return messages[-1][1]
    return None


def _parts_text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for part in parts or []:
        if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("content"), str):
            texts.append(part["content"])
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "".join(texts)


def _message_texts(messages: Any) -> list[tuple[str, str]]:
    """(role, text) of GenAI / OpenAI-style chat messages."""
    out = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "")
        if "parts" in message:
            text = _parts_text(message.get("parts"))
        else:
            content = message.get("content")
            text = content if isinstance(content, str) else _parts_text(content)
        if text.strip():
            out.append((role, text))
    return out


def _load(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except RecursionError:
            return None
        except ValueError:
            return value
    return value


def genai_texts(attributes: dict[str, Any]) -> Optional[tuple[str, str]]:
    """(question, answer) from GenAI semantic-convention attributes, or None."""
    question = answer = None
    if "gen_ai.input.messages" in attributes:
        users = [text for role, text in _message_texts(_load(attributes["gen_ai.input.messages"])) if role == "user"]
        question = users[-1] if users else None
    if "gen_ai.output.messages" in attributes:
        outputs = _message_texts(_load(attributes["gen_ai.output.messages"]))
        answer = "".join(text for role, text in outputs if role in ("assistant", "")) or None
    if question is None and "gen_ai.prompt" in attributes:
        prompt = _load(attributes["gen_ai.prompt"])
        users = [text for role, text in _message_texts(prompt) if role == "user"] if isinstance(prompt, list) else []
        question = users[-1] if users else (prompt if isinstance(prompt, str) else None)
    if answer is None and "gen_ai.completion" in attributes:
        completion = _load(attributes["gen_ai.completion"])
        texts = _message_texts(completion) if isinstance(completion, list) else []
        answer = "".join(t for _, t in texts) if texts else (completion if isinstance(completion, str) else None)
    if question is None or answer is None:
        indexed: dict[tuple[str, int], dict[str, Any]] = {}
        for key, value in attributes.items():
            match = _INDEXED.match(key)
            if match:
                indexed.setdefault((match.group(1), int(match.group(2))), {})[match.group(3)] = value
        if question is None:
            prompts = [v for (kind, _), v in sorted(indexed.items()) if kind == "prompt" and v.get("role") == "user" and isinstance(v.get("content"), str)]
            question = prompts[-1]["content"] if prompts else None
        if answer is None:
            completions = [v["content"] for (kind, _), v in sorted(indexed.items()) if kind == "completion" and isinstance(v.get("content"), str)]
            answer = "".join(completions) if completions else None
    if isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip():
        return question, answer
    return None


def openinference_texts(attributes: dict[str, Any]) -> Optional[tuple[str, str]]:
    """(question, answer) from OpenInference ``input.value`` / ``output.value``, or None."""
    raw_in, raw_out = attributes.get(A.INPUT_VALUE), attributes.get(A.OUTPUT_VALUE)
    if not isinstance(raw_in, str) or not isinstance(raw_out, str):
        return None
    question = _json_field(raw_in, QUESTION_FIELDS) if "json" in str(attributes.get("input.mime_type", "")) or raw_in.lstrip().startswith(("{", "[")) else raw_in
    answer = _json_field(raw_out, ANSWER_FIELDS) if "json" in str(attributes.get("output.mime_type", "")) or raw_out.lstrip().startswith(("{", "[")) else raw_out
    if isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip():
        return question, answer
    return None


def span_documents(attributes: dict[str, Any]) -> list[str]:
    """``retrieval.documents.<i>.document.content`` values in index order."""
    found = []
    for key, value in attributes.items():
        match = _DOCUMENT.match(key)
        if match and isinstance(value, str):
            found.append((int(match.group(1)), value))
    return [text for _, text in sorted(found)]


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
        text_completion or generate_content) passing the static filters whose question and
        answer are not on the span: its content may come as log events (``join.py``)."""
        return self._inference(span) and self.texts(span) is None

    def _inference(self, span: ReceivedSpan) -> bool:
        return str(span.attributes.get("gen_ai.operation.name") or "") in INFERENCE_OPERATIONS and self.passes(span)

    def texts(self, span: ReceivedSpan) -> Optional[tuple[str, str, str]]:
        """(question, answer, convention) when ``span`` passes the static filters."""
        attrs = span.attributes
        if not self.passes(span):
            return None
        kind = attrs.get(A.OPENINFERENCE_SPAN_KIND)
        try:
            found = openinference_texts(attrs) if kind is not None else None
            if found is not None:
                return found[0], found[1], "openinference"
            found = genai_texts(attrs)
        except RecursionError:  # JSON nested too deeply to hold a question or an answer
            return None
        if found is not None:
            return found[0], found[1], "genai"
        return None

    def select(self, spans: Sequence[ReceivedSpan]) -> list[Candidate]:
        """The candidates of one batch, filtered, outermost first, then sampled.

        Linear in the number of spans: each span's ancestry is walked once per batch (memoised)
        and each trace's RETRIEVER documents are collected once."""
        return self.partition(spans)[0]

    def partition(self, spans: Sequence[ReceivedSpan]) -> tuple[list[Candidate], list[Candidate]]:
        """(candidates, pending) of one batch: pending are GenAI inference spans whose content
        may come as log events (:meth:`awaits_content`; question and answer empty, convention
        ``genai-events``), filtered, outermost and sampled alike with the candidates."""
        sel = self.selection
        by_trace: dict[str, dict[str, ReceivedSpan]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, {})[span.span_id] = span
        candidates = []
        for span in spans:
            texts = self.texts(span)
            if texts is not None:
                candidates.append(Candidate(span, texts[0], texts[1], None, texts[2]))
            elif self._inference(span):  # texts() found no content on it
                candidates.append(Candidate(span, "", "", None, "genai-events"))
        if sel.outermost_only and candidates:
            chosen: dict[str, set[str]] = {}
            for candidate in candidates:
                chosen.setdefault(candidate.span.trace_id, set()).add(candidate.span.span_id)
            covered: dict[str, dict[str, bool]] = {}
            candidates = [c for c in candidates if not _covered(c.span.parent_span_id, by_trace[c.span.trace_id], chosen[c.span.trace_id], covered.setdefault(c.span.trace_id, {}))]
        out = []
        retrieved: dict[str, list[str]] = {}
        for candidate in candidates:
            if not self._ratio.sample_trace_id(_trace_number(candidate.span.trace_id)):
                continue
            if self._rate is not None and not self._rate.should_sample(None):  # type: ignore[arg-type]
                continue
            candidate.contexts = self._contexts(candidate.span, by_trace[candidate.span.trace_id].values(), retrieved)
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


def _trace_number(trace_id: str) -> int:
    try:
        return int(trace_id, 16)
    except ValueError:
        return 0


def _covered(span_id: str, spans: dict[str, ReceivedSpan], chosen: set[str], memo: dict[str, bool]) -> bool:
    """Whether ``span_id`` or one of its ancestors in ``spans`` is in ``chosen``; every span on
    the walked path is memoised, so all the walks of a batch take linear time together. A
    parent cycle (malformed input) ends the walk as not covered."""
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
        if node in on_path or node not in spans:
            break
        on_path.add(node)
        path.append(node)
        node = spans[node].parent_span_id
    for visited in path:
        memo[visited] = result
    return result
