"""Robust parsing of model replies and the re-ask loop for malformed ones.

Models wrap JSON in code fences, add prose around it, or reply with something else entirely.
:func:`extract_json` finds the first JSON object or array in a reply; :func:`ask_json` sends a
prompt, validates the parsed reply, and re-asks (showing the model its bad reply and what was
wrong) up to ``retries`` times before failing with a named status.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Optional, Sequence

from ..models.base import ChatModel, ChatReply
from ..result import EvaluationError, Status, Usage

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()
_NUMBER = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)\s*(?:/\s*\d+(?:\.\d+)?)?\s*")


class ReplyError(ValueError):
    """A reply that parsed but does not hold what was asked; ``status`` names the failure."""

    def __init__(self, message: str, status: str = Status.INVALID_JSON):
        super().__init__(message)
        self.status = status


def extract_json(text: str) -> Any:
    """The first JSON object or array in ``text`` (code fences and surrounding prose allowed).

    Raises :class:`ReplyError` (status ``invalid_json``) when there is none.
    """
    if not isinstance(text, str) or not text.strip():
        raise ReplyError("the reply is empty")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        candidate = candidate.strip()
        try:
            return json.loads(candidate)
        except ValueError:
            pass
        for match in re.finditer(r"[\[{]", candidate):
            try:
                value, _ = _DECODER.raw_decode(candidate, match.start())
            except ValueError:
                continue
            return value
    raise ReplyError(f"no JSON object in the reply: {text[:200]!r}")


class CutJSON(dict):
    """A JSON object recovered from a reply the token budget cut off (:func:`close_cut_json`):
    validators may accept it with fewer items than a complete reply must hold."""


def close_cut_json(text: str) -> Any:
    """The JSON value a reply cut off by its token budget was writing, closed where it stopped.

    The first ``{`` or ``[`` opens the value; an open string is closed and kept (a question
    string that ran out of tokens is still a question), a dangling ``,``/``:`` or a key without
    its value is dropped, and the open arrays and objects are closed. Objects come back as
    :class:`CutJSON`. Raises :class:`ReplyError` (``invalid_json``) when nothing can be recovered.
    """
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ReplyError(f"no JSON value in the cut reply: {text[:200]!r}")
    body = text[start:]
    stack: list[str] = []
    in_string = escape = False
    cuts: list[tuple[int, str]] = []  # (end of a prefix that may end the value, closers it needs)
    for i, ch in enumerate(body):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack:
                break
            stack.pop()
            if not stack:
                return _as_cut(json.loads(body[: i + 1]))
        elif ch == ",":
            cuts.append((i, "".join(reversed(stack))))
    closers = "".join(reversed(stack))
    tail = body.rstrip()
    if in_string:
        tail = (tail[:-1] if escape else tail) + '"'
    candidates = [tail.rstrip(",: \n\t") + closers, tail + closers] + [body[:i] + c for i, c in reversed(cuts)]
    for candidate in candidates:
        try:
            return _as_cut(json.loads(candidate))
        except ValueError:
            continue
    raise ReplyError(f"the cut reply cannot be closed: {text[:200]!r}")


def _as_cut(value: Any) -> Any:
    return CutJSON(value) if isinstance(value, dict) else value


def read_flag(value: Any) -> bool:
    """A 0/1 flag as models write it: 0/1, true/false, "0"/"1", "yes"/"no". Raises ReplyError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false", "yes", "no"):
        return value.strip().lower() in ("1", "true", "yes")
    raise ReplyError(f"not a 0/1 flag: {value!r}")


def read_number(value: Any, low: float, high: float) -> float:
    """A number in [low, high] from a reply value (number, or a string holding exactly one).

    Anything else, e.g. "N/A", "high", two numbers, or an out-of-range value, raises
    :class:`ReplyError` with status ``unreadable_score``: an unreadable score is a named
    failure, never a silent 0.5 (the fallback of the sketch in the article "Answer Relevancy in RAG").
    """
    number: Optional[float] = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        # exactly one number, optionally "of" a scale: "0.8", " 7 ", "8/10"
        match = _NUMBER.fullmatch(value)
        number = float(match.group(1)) if match else None
    if number is None or not math.isfinite(number):
        raise ReplyError(f"not a number: {value!r}", Status.UNREADABLE_SCORE)
    if not low <= number <= high:
        raise ReplyError(f"{number} is outside [{low}, {high}]", Status.UNREADABLE_SCORE)
    return number


def judged_score(value: float, probs: Optional[dict[int, float]], low: int, high: int) -> float:
    """A judge's score on the integer scale [low, high] mapped to [0, 1].

    With the digit distribution at the score (``probs``), the expected value over the scale's
    digits is used (G-Eval, Liu et al. 2023, "G-Eval: NLG Evaluation using GPT-4 with Better
    Human Alignment", sec. 2.3): a continuous score that separates answers a greedy integer
    would tie (measured: 0.8 vs 0.0 pairwise accuracy on WikiEval with the local model, whose
    greedy 1-5 scores were all 5). Without it (or when most of the mass is off the scale), the
    sampled ``value`` is used.
    """
    if probs:
        on_scale = {d: p for d, p in probs.items() if low <= d <= high}
        mass = sum(on_scale.values())
        if mass >= 0.5:
            expected = sum(d * p for d, p in on_scale.items()) / mass
            return (expected - low) / (high - low)
    return (value - low) / (high - low)


async def ask_json(
    llm: ChatModel,
    messages: Sequence[dict],
    schema: dict,
    validate: Callable[[Any], Any],
    *,
    usage: Usage,
    retries: int,
    max_tokens: int,
    temperature: float = 0.0,
    seed: Optional[int] = None,
    score_key: Optional[str] = None,
) -> tuple[Any, ChatReply]:
    """Ask ``llm`` for JSON, parse and ``validate`` it, re-asking a bad reply up to ``retries`` times.

    Returns ``(validated value, the reply it came from)``; ``score_key`` is passed to the
    backend (digit probabilities of that key, see ``ChatModel.chat_json``).

    ``validate(parsed)`` returns the value to use or raises :class:`ReplyError` (any
    ``ValueError``/``TypeError``/``KeyError`` counts as a malformed reply too). Every request's
    tokens are added to ``usage``. A reply cut off by ``max_tokens`` (``finish_reason ==
    "length"``) that does not validate as is is closed where it stopped (:func:`close_cut_json`)
    and validated again before any re-ask. After the last attempt raises :class:`EvaluationError` with the
    last error's status (``invalid_json`` or ``unreadable_score``). Model failures propagate as
    :class:`~relevancy_tracer.models.base.ModelError`.
    """
    conversation = list(messages)
    last_error: Exception = ReplyError("no reply")
    for _ in range(retries + 1):
        reply = await llm.chat_json(conversation, schema, max_tokens=max_tokens, temperature=temperature, seed=seed, score_key=score_key)
        usage.add(reply.input_tokens, reply.output_tokens, llm_calls=1)
        try:
            return validate(extract_json(reply.text)), reply
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            last_error = exc
        if reply.finish_reason == "length":
            # cut off by the token budget: what was written is closed and kept, not re-asked
            try:
                return validate(close_cut_json(reply.text)), reply
            except (ValueError, TypeError, KeyError, AttributeError, IndexError):
                pass
        hint = " (it was cut off: be shorter)" if reply.finish_reason == "length" else ""
        conversation = list(messages) + [
            {"role": "assistant", "content": reply.text[:2000]},
            {
                "role": "user",
                "content": f"That reply is not usable: {last_error}{hint}. Reply again with only a JSON object "
                f"matching this JSON schema: {json.dumps(schema, separators=(',', ':'))}",
            },
        ]
    status = getattr(last_error, "status", Status.INVALID_JSON)
    raise EvaluationError(status, f"no usable reply after {retries + 1} attempt(s): {last_error}")
