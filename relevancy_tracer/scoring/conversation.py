"""The conversation a question was asked in: reading the earlier turns, their bounds, repeats.

A follow-up ("Gifting", "I'm in US, give me a rate here") is a question only in its
conversation. When a call comes with its earlier turns, the engine judges the last turn in its
conversation (:mod:`relevancy_tracer.scoring.engine`): the model first rewrites the last user
turn as a standalone question from the history (the "condense question" step of
conversational retrieval: Anantha et al. 2021, "Open-Domain Question Answering Goes
Conversational via Question Rewriting", QReCC; LangChain's ``ConversationalRetrievalChain``),
the method then scores the answer against that standalone question, and an answer that repeats
an earlier assistant turn (:func:`repeat`) gets no credit for being on topic: it answered the
conversation's earlier question, not this one.

The history is read here from the shapes apps and instrumentations use (:func:`read_history`):

* a list of OpenAI-style chat messages ``{"role": "user" | "assistant" | "system" | "tool",
  "content": str | [{"type": "text", "text": str}, ...]}``;
* LangChain messages (``type`` ``human`` / ``ai`` / ``system`` / ``tool`` and ``content``) and
  LlamaIndex ``ChatMessage`` (``role`` and ``content`` or text ``blocks``), read as plain data
  (attributes are read with ``inspect.getattr_static``: no property or ``__getattr__`` of the
  app runs);
* ``(role, content)`` pairs.

System, tool and function messages and non-text parts are left out. The read is bounded: at most
``max_turns`` of the most recent turns and ``max_chars`` characters in all (each turn cut to at
most half of it, oldest turns dropped first), so a call with a thousand-turn history costs a
bounded prompt. A value of any other shape raises :class:`HistoryError`, and the engine scores
the call as single-turn with the reason recorded (``relevancy.history.status``).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import types
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from . import prompts

#: What a turn's role is read as: user or assistant; every other role is left out.
USER_ROLES = frozenset({"user", "human"})
ASSISTANT_ROLES = frozenset({"assistant", "ai", "model", "bot", "chatbot"})
SKIPPED_ROLES = frozenset({"system", "developer", "tool", "function", "ipython"})

#: Messages looked at, at most, per turn kept (system and tool messages between turns are
#: skipped): only the last ``4 * max_turns + 8`` items of a history are read, so a hostile list
#: of millions of items costs a few dozen lookups, on the app's thread too.
MESSAGES_PER_TURN = 4

#: Word shingles of this many tokens make up :func:`repeat`'s units.
SHINGLE = 4

#: An answer whose :func:`repeat` is at least this repeats an earlier assistant turn.
REPEAT_THRESHOLD = 0.8

#: Reasons a history was not read (``relevancy.history.status``), besides ``read``.
HISTORY_INVALID = "invalid"


class HistoryError(ValueError):
    """A history value of no known shape (not a list of chat messages)."""


@dataclass(frozen=True)
class Turn:
    """One earlier turn: ``role`` is ``user`` or ``assistant``; ``content`` its text."""

    role: str
    content: str


@dataclass(frozen=True)
class History:
    """The earlier turns read from a call, oldest first, within the bounds.

    Attributes:
        turns: the turns kept (at most ``max_turns``, ``max_chars`` characters in all).
        total: the user and assistant turns found before bounding.
        truncated: True when turns were dropped or cut.
        invalid: True when the history given had no known shape (no turns then: the call is
            judged as single-turn, ``relevancy.history.status`` ``invalid``).
    """

    turns: tuple[Turn, ...] = ()
    total: int = 0
    truncated: bool = False
    invalid: bool = False

    def __bool__(self) -> bool:
        return bool(self.turns)

    def key(self) -> str:
        """A digest of the turns (a cache key for steps that read them)."""
        digest = hashlib.sha256()
        for turn in self.turns:
            digest.update(turn.role.encode() + b"\0" + turn.content.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()

    def as_messages(self) -> list[dict[str, str]]:
        """The turns as ``[{"role", "content"}]`` (JSON-serialisable; the fleet's job format)."""
        return [{"role": t.role, "content": t.content} for t in self.turns]


def _plain(obj: Any, key: str) -> Any:
    """``obj[key]`` of a dict, else the attribute when it is plain data (no app code runs)."""
    if isinstance(obj, dict):
        return obj.get(key)
    if isinstance(obj, (str, bytes, int, float, list, tuple, type(None))):
        return None
    try:
        value = inspect.getattr_static(obj, key)
    except AttributeError:
        return None
    if isinstance(value, types.MemberDescriptorType):  # a __slots__ value
        try:
            return value.__get__(obj, type(obj))
        except AttributeError:
            return None
    if hasattr(type(value), "__get__") and not isinstance(value, (str, bytes)):
        return None  # a property or other descriptor: it would run the app's code
    return value


def _role(message: Any) -> Optional[str]:
    if isinstance(message, (tuple, list)) and len(message) == 2:
        role = message[0]
    else:
        role = _plain(message, "role")
        if role is None:
            role = _plain(message, "type")
    value = _plain(role, "_value_") if role is not None and not isinstance(role, str) else role  # an Enum
    return value.lower() if isinstance(value, str) else None


def _text(content: Any) -> Optional[str]:
    """Text of a message's content: a str, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content[:64]:
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = _plain(part, "type")
            if kind not in (None, "text", "input_text", "output_text"):
                continue
            text = _plain(part, "text")
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts) if texts else None
    return None


def _content(message: Any) -> Optional[str]:
    if isinstance(message, (tuple, list)) and len(message) == 2:
        return _text(message[1])
    text = _text(_plain(message, "content"))
    if text is None:  # LlamaIndex >= 0.12 keeps text in blocks; content is a property
        text = _text(_plain(message, "blocks"))
    return text


def read_history(value: Any, max_turns: int, max_chars: int) -> History:
    """The earlier user and assistant turns in ``value``, bounded (see the module docstring).

    Args:
        value: None, an empty list, or a list/tuple of chat messages (dicts, LangChain or
            LlamaIndex message objects, ``(role, content)`` pairs), oldest first, or a
            :class:`History` (bounded again). Only its last ``4 * max_turns + 8`` items are read.
        max_turns: most recent turns kept (0: none).
        max_chars: characters of all kept turns together; each turn is cut to ``max_chars // 2``.

    Returns:
        A :class:`History` (empty for None, an empty list, or a list without user or assistant text).

    Raises:
        HistoryError: ``value`` is not a list or tuple, or one of its items is not a message
            (a dict or object with a role/type and text content, or a pair).
    """
    if value is None:
        return History()
    if isinstance(value, History):
        if value.invalid:
            raise HistoryError("the history given had no known shape")
        value = value.as_messages()
    if not isinstance(value, (list, tuple)):
        raise HistoryError(f"history must be a list of chat messages, not {type(value).__name__}")
    start = max(0, len(value) - (MESSAGES_PER_TURN * max_turns + 8))
    found: list[Turn] = []
    for message in value[start:]:
        role = _role(message)
        if role is None:
            raise HistoryError(f"a history item has no role: {type(message).__name__}")
        if role in SKIPPED_ROLES:
            continue
        if role not in USER_ROLES and role not in ASSISTANT_ROLES:
            raise HistoryError(f"a history item has an unknown role {role[:32]!r}")
        text = _content(message)
        if text is None or not text.strip():
            continue
        found.append(Turn("user" if role in USER_ROLES else "assistant", text.strip()))
    kept: list[Turn] = []
    budget, per_turn = max_chars, max(1, max_chars // 2)
    truncated = start > 0
    for turn in reversed(found[-max_turns:] if max_turns > 0 else []):
        if budget <= 0:
            truncated = True
            break
        text = turn.content[: min(per_turn, budget)]
        truncated = truncated or len(text) < len(turn.content)
        kept.append(Turn(turn.role, text))
        budget -= len(text)
    kept.reverse()
    truncated = truncated or len(kept) < len(found)
    return History(tuple(kept), total=len(found) + start, truncated=truncated)


def split_last_question(messages: Any, max_turns: int, max_chars: int) -> Optional[tuple[str, History]]:
    """(the last user message's text, the turns before it) of a chat ``messages`` list, e.g. an
    OpenAI ``messages`` argument; None when ``messages`` is not a list of messages or holds no
    user text. A trailing assistant message (the reply already appended) is left out. Bounded as
    :func:`read_history`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        return None
    window = messages[-(MESSAGES_PER_TURN * max_turns + 8) :]
    for index in range(len(window) - 1, -1, -1):
        message = window[index]
        if _role(message) in USER_ROLES:
            text = _content(message)
            if text is None or not text.strip():
                return None
            cut = len(messages) - len(window) + index
            try:
                past = read_history(list(messages[max(0, cut - len(window)) : cut]), max_turns, max_chars)
            except HistoryError:
                past = History()
            return text, past
    return None


def without_question(past: History, question: str) -> History:
    """``past`` without its last turn when that turn is the user's ``question`` itself (an app
    that passes its whole message list, the current question included)."""
    if past.turns and past.turns[-1].role == "user" and past.turns[-1].content == question.strip():
        return History(past.turns[:-1], total=past.total - 1, truncated=past.truncated)
    return past


_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]+", re.UNICODE)


def _shingles(text: str) -> set[tuple[str, ...]]:
    tokens = _TOKEN.findall(text.lower())
    if len(tokens) < SHINGLE:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + SHINGLE]) for i in range(len(tokens) - SHINGLE + 1)}


def repeat(answer: str, turns: Sequence[Turn]) -> float:
    """The largest share of the answer's word 4-grams (CJK: character 4-grams) found in one
    earlier assistant turn, in [0, 1]: 1.0 for an answer that repeats an earlier answer
    verbatim, about 0 for a new one. On the multi-turn dev set the right answers' values are
    0-0.72 (median 0.01) and the earlier turns' answers' 1.0 (docs/methods.md). No model call;
    linear in the texts' lengths."""
    mine = _shingles(answer)
    if not mine:
        return 0.0
    best = 0.0
    for turn in turns:
        if turn.role == "assistant":
            best = max(best, len(mine & _shingles(turn.content)) / len(mine))
    return best


def fingerprint(max_turns: int, max_chars: int) -> dict[str, Any]:
    """What determines how a conversation is judged (part of the evaluator version of an
    evaluation that read a history): the rewrite prompt, the bounds and the repeat rule."""
    return {
        "standalone": prompts.standalone_question([Turn("user", "TURN"), Turn("assistant", "REPLY")], "QUESTION"),
        "schema": prompts.STANDALONE_SCHEMA,
        "max_turns": max_turns,
        "max_chars": max_chars,
        "repeat": {"shingle": SHINGLE, "threshold": REPEAT_THRESHOLD},
    }
