"""Chat messages as instrumentations record them: one message's role, text and tool calls.

The shapes read (plain JSON values, never app objects): OpenAI / OTel GenAI messages (``role``
and ``content`` as a string or a list of text parts, GenAI ``parts``), LangChain's serialised
messages (``type`` human / ai, ``kwargs``, ``message_to_dict``'s ``data``, ``("role", "text")``
tuples), and the Responses API's input items (tool calls and their outputs). Shared by the span
selection (:mod:`.selection`) and the GenAI event join (:mod:`.join`), which both read messages
and neither reads the other's.
"""

from __future__ import annotations

import json
from typing import Any, Optional


def role_of(message: dict) -> str:
    """A chat message's role: OpenAI / GenAI ``role``, LangChain's ``type`` (human, ai) or its
    serialised ``kwargs.type`` / class name; normalised to user | assistant | system | tool."""
    role = message.get("role") or message.get("type")
    kwargs = message.get("kwargs") if isinstance(message.get("kwargs"), dict) else None
    if (not isinstance(role, str) or role == "constructor") and kwargs is not None:
        role = kwargs.get("type") or kwargs.get("role")
        ids = message.get("id")
        if not isinstance(role, str) and isinstance(ids, list) and ids and isinstance(ids[-1], str):
            role = ids[-1].replace("MessageChunk", "").replace("Message", "").lower()
    role = str(role or "").lower()
    return {"human": "user", "ai": "assistant", "developer": "system", "function": "tool"}.get(role, role)


def content_text(content: Any) -> Optional[str]:
    """Text of a message's content: a string, or the text parts of a list of parts (OpenAI
    ``{"type": "text", "text"}``, GenAI ``{"type": "text", "content"}``, Responses API
    ``output_text``); None when there is no text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") in ("text", "input_text", "output_text"):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    texts.append(text)
        return "".join(texts) if texts else None
    return None


def read_message(message: Any) -> Optional[tuple[str, Optional[str], bool]]:
    """(role, text, calls a tool) of one chat message in any of the forms of the module docstring, or None when
    ``message`` is not a message (no role and no content). Also LangChain's ``message_to_dict``
    form (``{"type": "ai", "data": {"content", "tool_calls"}}``, as LangGraph's state is
    serialised), its message tuples (``["user", "text"]``), and the Responses API's input items
    (``function_call``: an assistant turn calling a tool; ``function_call_output``: a tool's)."""
    if isinstance(message, list) and len(message) == 2 and isinstance(message[0], str) and isinstance(message[1], str):
        role = role_of({"role": message[0]})
        return (role, message[1], False) if role in ROLES else None
    if not isinstance(message, dict):
        return None
    kind = message.get("type")
    if kind in ("function_call", "custom_tool_call", "computer_call", "mcp_call"):
        return "assistant", None, True
    if kind in ("function_call_output", "custom_tool_call_output", "computer_call_output"):
        output = message.get("output")
        return "tool", output if isinstance(output, str) else None, False
    if kind == "reasoning":
        return "assistant", None, False
    role = role_of(message)
    body = message
    if "content" not in message:
        if isinstance(message.get("kwargs"), dict):
            body = message["kwargs"]
        elif isinstance(message.get("data"), dict) and isinstance(kind, str):  # LangChain's message_to_dict
            body = message["data"]
    if "parts" in body:
        text = content_text(body.get("parts"))
    else:
        text = content_text(body.get("content"))
    if not role and "content" not in body and "parts" not in body:
        return None
    tool = bool(body.get("tool_calls")) or (isinstance(body.get("parts"), list) and any(isinstance(p, dict) and p.get("type") == "tool_call" for p in body["parts"]))
    return role, text, tool


ROLES = frozenset({"user", "assistant", "system", "tool"})


def read_messages(value: Any) -> Optional[list[tuple[str, Optional[str], bool]]]:
    """The messages of a chat message list (LangChain's batched ``[[...]]``: the last batch);
    None when ``value`` is not a non-empty list of messages."""
    if isinstance(value, list) and value and isinstance(value[-1], list) and read_message(value[-1]) is None:
        value = value[-1]  # a batch of message lists, not LangChain's ("role", "text") tuples
    if not isinstance(value, list) or not value:
        return None
    out = [m for m in (read_message(item) for item in value) if m is not None]
    return out if len(out) == len(value) else None


def load_json(value: Any) -> Any:
    """A string parsed as JSON when it is JSON (itself when not; None when nested past the
    parser's recursion limit); any other value as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except RecursionError:
            return None
        except ValueError:
            return value
    return value


def parts_text(parts: Any) -> str:
    """The text of a string, or of a list of content parts (:func:`content_text`); "" else."""
    if isinstance(parts, str):
        return parts
    return content_text(parts if isinstance(parts, list) else []) or ""


def message_texts(messages: Any) -> list[tuple[str, str]]:
    """(role, text) of GenAI / OpenAI-style chat messages with text."""
    found = [m for m in (read_message(item) for item in messages) if m is not None] if isinstance(messages, list) else []
    return [(role, text) for role, text, _ in found if text and text.strip()]
