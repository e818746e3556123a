"""Fast decoding for the embedded llama.cpp model: KV-cache slots, forced JSON prefixes,
single-pass judgements.

The local chat model spends its time in two places on a small CPU: evaluating prompt tokens
(about 130 tokens/s for the 1.5B model on 2 cores) and generating tokens one at a time (about 18
tokens/s). :class:`Decoder` cuts both, on top of llama.cpp's low-level API (llama-cpp-python's
``_internals``), without changing what the model computes:

* **KV-cache slots.** The context holds ``n_slots`` sequences (llama.cpp's unified KV cache). A
  prompt goes to the slot sharing its longest prefix; a slot being reused first copies the best
  matching prefix from any other slot (``llama_memory_seq_cp``: no recomputation), so the fixed
  system prompt is evaluated once per process and the answer once per evaluation, even when
  several evaluations interleave their requests. This is llama.cpp server's prompt cache, in
  process.
* **Forced prefixes.** The reply's opening (``{"questions": ["``, ``{"score": ``) is part of the
  prompt, so the model neither spends tokens on it nor wanders off the format.
* **Single-pass judgements.** For a 1-5 score, the distribution over the digit tokens right after
  ``{"score": `` is read from one forward pass (G-Eval's expected value, Liu et al. 2023); no
  token is generated.
* **JSON-aware stopping.** Generation stops as soon as the JSON value opened by the prefix is
  closed (a small scanner tracks strings and nesting), not at ``max_tokens`` or end of turn.

Greedy decoding (temperature 0) takes the arg-max of the logits; temperature > 0 samples from
the top-k (40) / top-p (0.95) renormalised distribution with a seeded NumPy generator, so replies
are reproducible. Callers serialise access (one inference lock per model).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np


class DecodeCancelled(Exception):
    """Raised inside decoding when the caller's cancellation event is set."""


class JSONScanner:
    """Tracks whether a JSON value written incrementally is complete.

    ``feed(text)`` returns True once the value that was open at the start (``depth`` levels deep,
    e.g. 1 after the prefix ``{"score": ``) is closed. Strings and escapes are honoured.
    """

    def __init__(self, prefix: str = "") -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False
        self.done = False
        self.feed(prefix)

    def feed(self, text: str) -> bool:
        for ch in text:
            if self.done:
                break
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                if self.started and self.depth <= 0:
                    self.done = True
        return self.done


@dataclass
class _Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)
    last_used: int = 0


@dataclass
class DecodeStats:
    """Counters since the decoder was created (for benchmarks)."""

    prompt_tokens: int = 0  # tokens evaluated for prompts (after cache reuse)
    cached_tokens: int = 0  # prompt tokens served from the cache
    generated_tokens: int = 0
    decode_calls: int = 0


class Decoder:
    """Decoding over one llama.cpp context with ``n_slots`` cached sequences.

    Args:
        model: llama-cpp-python's ``_internals.LlamaModel`` (shared with the ``Llama`` object
            that loaded it).
        n_ctx: KV-cache cells shared by all slots (tokens). n_batch: tokens per decode call.
        n_threads: CPU threads. n_slots: cached sequences (1..8).
        eos_tokens: token ids that end a turn.

    Not thread-safe: the owner serialises calls. Raises RuntimeError when llama.cpp fails.
    """

    def __init__(self, model: Any, *, n_ctx: int, n_batch: int, n_threads: int, n_slots: int = 4, eos_tokens: Sequence[int] = ()):
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.n_seq_max = max(1, min(8, n_slots))
        params.kv_unified = True
        params.no_perf = True
        self._context = _internals.LlamaContext(model=model, params=params, verbose=False)
        self.ctx = self._context.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_vocab = int(model.n_vocab())
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.eos = frozenset(int(t) for t in eos_tokens)
        self.slots = [_Slot(seq) for seq in range(params.n_seq_max)]
        self._clock = 0
        self.stats = DecodeStats()
        self._closed = False

    def close(self) -> None:
        """Free the context and batch (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._llama_cpp.llama_batch_free(self._batch)
        finally:
            self._context.close()

    # ------------------------------------------------------------------ KV management

    @staticmethod
    def _common(a: Sequence[int], b: Sequence[int]) -> int:
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i

    def _cells_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def _choose(self, tokens: Sequence[int]) -> tuple[_Slot, int]:
        """The slot for ``tokens`` and how many of its tokens are reused.

        The slot with the longest common prefix wins when that prefix is at least half the slot
        (it is being extended, e.g. a second turn); otherwise the least recently used slot is
        taken and the best prefix found in any slot is copied into it.
        """
        scored = [(self._common(s.tokens, tokens), s) for s in self.slots]
        best_len, best = max(scored, key=lambda x: (x[0], x[1].last_used))
        if best_len and (best_len >= len(best.tokens) // 2 or best_len == len(tokens)):
            target, reuse = best, best_len
        else:
            target = min(self.slots, key=lambda s: s.last_used)
            reuse = 0
            if best is not target and best_len > 0:
                mem = self.memory
                self._llama_cpp.llama_memory_seq_rm(mem, target.seq, -1, -1)
                self._llama_cpp.llama_memory_seq_cp(mem, best.seq, target.seq, 0, best_len)
                target.tokens = list(tokens[:best_len])
                reuse = best_len
            else:
                reuse = self._common(target.tokens, tokens)
        if reuse >= len(tokens):
            reuse = len(tokens) - 1  # re-evaluate the last token to get its logits
        self._llama_cpp.llama_memory_seq_rm(self.memory, target.seq, reuse, -1)
        del target.tokens[reuse:]
        self._clock += 1
        target.last_used = self._clock
        return target, reuse

    def _make_room(self, keep: _Slot, needed: int) -> None:
        """Evict least recently used other slots until ``needed`` more cells fit."""
        while self._cells_used() + needed > self.n_ctx:
            others = [s for s in self.slots if s is not keep and s.tokens]
            if not others:
                raise RuntimeError(f"prompt of {len(keep.tokens) + needed} tokens does not fit the {self.n_ctx}-token context")
            victim = min(others, key=lambda s: s.last_used)
            self._llama_cpp.llama_memory_seq_rm(self.memory, victim.seq, -1, -1)
            victim.tokens = []

    def _decode(self, slot: _Slot, tokens: Sequence[int], logits_for: int, cancelled: Optional[threading.Event]) -> list[np.ndarray]:
        """Append ``tokens`` to ``slot``; logits rows for the last ``logits_for`` tokens."""
        lib = self._llama_cpp
        self._make_room(slot, len(tokens))
        batch = self._batch
        rows: list[np.ndarray] = []
        n = len(tokens)
        for start in range(0, n, self.n_batch):
            if cancelled is not None and cancelled.is_set():
                raise DecodeCancelled()
            chunk = tokens[start : start + self.n_batch]
            batch.n_tokens = len(chunk)
            base = len(slot.tokens)
            wanted = []
            for j, token in enumerate(chunk):
                batch.token[j] = token
                batch.pos[j] = base + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = slot.seq
                want = start + j >= n - logits_for
                batch.logits[j] = want
                if want:
                    wanted.append(j)
            code = lib.llama_decode(self.ctx, batch)
            self.stats.decode_calls += 1
            if code != 0:
                # the failed batch may be partly in the cache: forget the slot entirely
                lib.llama_memory_seq_rm(self.memory, slot.seq, -1, -1)
                slot.tokens = []
                raise RuntimeError(f"llama_decode failed with code {code}")
            slot.tokens.extend(chunk)
            for j in wanted:
                pointer = lib.llama_get_logits_ith(self.ctx, j)
                rows.append(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy())
        return rows

    def prefill(self, tokens: Sequence[int], cancelled: Optional[threading.Event] = None) -> tuple[_Slot, np.ndarray]:
        """Make a slot hold exactly ``tokens``; returns it and the logits after the last token."""
        if not tokens:
            raise ValueError("empty prompt")
        slot, reuse = self._choose(tokens)
        self.stats.cached_tokens += reuse
        self.stats.prompt_tokens += len(tokens) - reuse
        rows = self._decode(slot, list(tokens[reuse:]), 1, cancelled)
        return slot, rows[-1]

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        tokens: Sequence[int],
        *,
        max_tokens: int,
        detokenize: Callable[[list[int]], str],
        stop: Optional[Callable[[str], bool]] = None,
        temperature: float = 0.0,
        seed: Optional[int] = None,
        cancelled: Optional[threading.Event] = None,
    ) -> tuple[list[int], str]:
        """Generate after ``tokens``; returns (generated tokens, finish reason).

        ``stop(text_piece)`` is fed each new token's text and returns True to stop after it
        (finish reason ``stop``); end-of-turn tokens also stop (``stop``); ``max_tokens``
        gives ``length``.
        """
        slot, logits = self.prefill(tokens, cancelled)
        rng = np.random.default_rng(seed) if temperature > 0 else None
        out: list[int] = []
        while True:
            token = _pick(logits, temperature, rng)
            if token in self.eos:
                return out, "stop"
            out.append(token)
            self.stats.generated_tokens += 1
            if stop is not None and stop(detokenize([token])):
                return out, "stop"
            if len(out) >= max_tokens:
                return out, "length"
            logits = self._decode(slot, [token], 1, cancelled)[-1]

    def distribution(self, tokens: Sequence[int], candidates: dict[int, int], cancelled: Optional[threading.Event] = None) -> tuple[dict[int, float], float]:
        """The next-token probabilities of ``candidates`` (token id -> value) after ``tokens``.

        Returns (value -> probability renormalised over the candidates, total softmax mass the
        candidates hold). One forward pass; nothing is generated.
        """
        _, logits = self.prefill(tokens, cancelled)
        logits = logits.astype(np.float64)
        top = float(logits.max())
        z = np.exp(logits - top)
        total = float(z.sum())
        probs: dict[int, float] = {}
        for token, value in candidates.items():
            probs[value] = probs.get(value, 0.0) + float(z[token]) / total
        mass = sum(probs.values())
        if mass <= 0:
            return {}, 0.0
        return {value: p / mass for value, p in probs.items()}, mass


def _pick(logits: np.ndarray, temperature: float, rng: Optional[np.random.Generator], top_k: int = 40, top_p: float = 0.95) -> int:
    """Arg-max at temperature 0, else a top-k / top-p sample at ``temperature``."""
    if temperature <= 0 or rng is None:
        return int(np.argmax(logits))
    k = min(top_k, logits.shape[0])
    candidates = np.argpartition(logits, -k)[-k:]
    scaled = logits[candidates].astype(np.float64) / temperature
    order = np.argsort(-scaled)
    candidates, scaled = candidates[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
    probs = probs[:keep] / probs[:keep].sum()
    return int(candidates[rng.choice(len(probs), p=probs)])


def json_prefix(schema: dict) -> str:
    """The opening of a reply to ``schema``, forced into the prompt: ``{"<first required key>": ``
    followed by ``[`` for arrays and ``"`` for strings (and array items that are strings).
    Empty for schemas that are not objects with a required first property."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return ""
    required = schema.get("required") or []
    properties = schema.get("properties") or {}
    if not required or required[0] not in properties:
        return ""
    key = required[0]
    prop = properties[key]
    prefix = '{"' + key + '": '
    kind = prop.get("type")
    if kind == "array":
        prefix += "["
        if (prop.get("items") or {}).get("type") == "string":
            prefix += '"'
    elif kind == "string":
        prefix += '"'
    return prefix
