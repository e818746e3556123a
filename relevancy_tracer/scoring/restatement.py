"""How much of an answer is the question restated: novelty and the residual text.

Real RAG failures often return the question itself as the answer ("echo"), or say that the
documents do not answer it while naming it ("hedge": "Based on the context, it is not stated
whether ..."). Both share most of their words with the question, so the answer's embedding
similarity to the question and RAGAS's reverse-generated questions (regenerated from the
question, they are the question) rate them as on topic. What the answer adds beyond the
question tells them apart from an answer:

* :func:`novelty`: the share of the answer's content units that are not in the question
  (English and other space-separated scripts: content words; Chinese/Japanese: character
  bigrams). An echo has about 0, a hedge 0.3-0.6 (its template words), a real answer mostly
  0.7-1.0. A bare "Yes, X is Y." restating the question has little novelty too.
* :func:`residual`: the answer with the question's words (CJK: characters of shared bigrams)
  removed, what is left to embed. An echo leaves nothing; a hedge leaves its template ("Based on
  the context provided, there is no direct answer to the"), far from the question; a real answer
  keeps its content.

No model call: word and character-bigram sets, as the word-overlap baseline of the quality
benchmark.
"""

from __future__ import annotations

import re

#: words of scripts written with spaces (runs of letters and digits that are not CJK): a number
#: the question holds ("life plus 25 years") is part of what an echo repeats
_WORD = re.compile(r"[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]+", re.UNICODE)
#: stop words left out of content words (English function words and question words)
STOP_WORDS = frozenset(
    "the a an of to in on for and or is are was were be been by with what how why when where which who whom whose does do did "
    "can could should would will it its this that these those from as at about into than then there their i you we they he she "
    "my your our me us them his her not no yes if so such any some all more most other".split()
)


def _is_wide(ch: str) -> bool:
    """A CJK ideograph or kana: scripts written without spaces, compared as character bigrams."""
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or "\u3040" <= ch <= "\u30ff"


def cjk_bigrams(text: str) -> set[str]:
    """Bigrams of consecutive CJK characters (punctuation and other characters break a run)."""
    return {text[i : i + 2] for i in range(len(text) - 1) if _is_wide(text[i]) and _is_wide(text[i + 1])}


def _words(text: str) -> list[str]:
    """Lower-cased words of the non-CJK parts of ``text``."""
    return _WORD.findall(text.lower())


def content_words(text: str) -> list[str]:
    """Lower-cased words (letters and digits) of more than 2 characters that are not
    :data:`STOP_WORDS` (non-CJK text)."""
    return [w for w in _words(text) if w not in STOP_WORDS and len(w) > 2]


def novelty(question: str, answer: str) -> float:
    """Share of the answer's content units not found in the question, in [0, 1].

    Units: the answer's content words (:func:`content_words`) not among the question's words,
    and its CJK bigrams not among the question's. An answer with no content unit (empty,
    punctuation, only stop words) has novelty 0.
    """
    question_words = set(_words(question))
    question_bigrams = cjk_bigrams(question)
    words = content_words(answer)
    bigrams = [answer[i : i + 2] for i in range(len(answer) - 1) if _is_wide(answer[i]) and _is_wide(answer[i + 1])]
    total = len(words) + len(bigrams)
    if total == 0:
        return 0.0
    new = sum(1 for w in words if w not in question_words) + sum(1 for b in bigrams if b not in question_bigrams)
    return new / total


def residual(question: str, answer: str) -> str:
    """The answer without what it repeats of the question: words (any case) that occur in the
    question, and CJK characters of a bigram the question also holds (or standing alone and
    found in the question), are removed; the rest is
    kept in order. ``""`` when nothing but punctuation and spaces is left."""
    question_words = set(_words(question))
    question_bigrams = cjk_bigrams(question)
    question_chars = set(question)
    covered = [False] * len(answer)
    for i in range(len(answer) - 1):
        if answer[i : i + 2] in question_bigrams:
            covered[i] = covered[i + 1] = True
    for i, ch in enumerate(answer):
        # a CJK character standing alone (no bigram to compare) goes when the question has it
        if _is_wide(ch) and not (i > 0 and _is_wide(answer[i - 1])) and not (i + 1 < len(answer) and _is_wide(answer[i + 1])) and ch in question_chars:
            covered[i] = True
    out: list[str] = []
    last = 0
    for match in _WORD.finditer(answer):
        start, end = match.span()
        out.append("".join(ch for k, ch in enumerate(answer[last:start], last) if not covered[k]))
        word = match.group()
        if word.lower() not in question_words:
            out.append(word)
        last = end
    out.append("".join(ch for k, ch in enumerate(answer[last:], last) if not covered[k]))
    text = re.sub(r"\s+", " ", "".join(out)).strip()
    return text if any(ch.isalpha() for ch in text) else ""
