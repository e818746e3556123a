"""The two small protocols every model backend implements, and their reply types.

* :class:`ChatModel` answers a chat conversation with JSON under a JSON schema. The RAGAS
  question generator and every judge of the other methods are prompts over it, so one backend
  serves them all.
* :class:`Embedder` embeds a batch of texts in one request.

Backends raise :class:`ModelError` for anything that went wrong talking to the model (after
their own retries); the engine turns it into a result with status ``model_error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np


class ModelError(Exception):
    """A model request failed (HTTP error, connection error, timeout, backend crash).

    ``status``: the evaluation status it becomes (a subclass may name a narrower one).
    """

    status = "model_error"


@dataclass
class ChatReply:
    """One chat completion.

    Attributes:
        text: the assistant message content (expected to be JSON, not yet parsed).
        input_tokens, output_tokens: token usage as reported by the backend (0 if unknown).
        model: the model name the backend reports.
        finish_reason: ``stop``, ``length`` (cut by max_tokens), or the backend's value.
        score_probs: when ``score_key`` was asked for and the backend can see token
            probabilities: probability of each single-digit value (0-9) at the first digit of
            that key's value, normalised over the digits; else None.
    """

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    finish_reason: Optional[str] = None
    score_probs: Optional[dict[int, float]] = None


@dataclass
class EmbeddingReply:
    """Embeddings of a batch of texts.

    Attributes:
        vectors: array of shape (n, d), float32, one row per input text in input order; not
            necessarily normalised (the engine checks and L2-normalises them).
        input_tokens: tokens billed for the request (0 if unknown).
        model: the model name.
    """

    vectors: np.ndarray
    input_tokens: int = 0
    model: str = ""


@runtime_checkable
class ChatModel(Protocol):
    """Generates JSON replies to chat messages.

    ``name`` is the model name recorded on results and spans.
    """

    name: str

    async def chat_json(
        self,
        messages: Sequence[dict],
        schema: dict,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: Optional[int] = None,
        score_key: Optional[str] = None,
    ) -> ChatReply:
        """Complete ``messages`` (OpenAI chat format) with a JSON object matching ``schema``.

        The backend constrains output to the schema where it can (llama.cpp grammar, OpenAI
        ``response_format``); the caller still parses and validates the text. ``max_tokens``
        caps the reply length in tokens. With ``score_key``, the backend also reports the
        probabilities of the digits at the first digit of that key's value
        (``ChatReply.score_probs``) when it can see them: the judge's uncertainty, which makes
        expected-value scores possible (G-Eval, Liu et al. 2023). Raises :class:`ModelError`.
        """
        ...


@runtime_checkable
class Embedder(Protocol):
    """Embeds texts; ``name`` is the model name recorded on results and spans."""

    name: str

    async def embed(self, texts: Sequence[str]) -> EmbeddingReply:
        """Embed ``texts`` in ONE request. Returns (len(texts), d) vectors. Raises ModelError."""
        ...


@dataclass
class Models:
    """The pair of backends one engine uses."""

    llm: ChatModel
    embedder: Optional[Embedder] = None
    extras: dict = field(default_factory=dict)
