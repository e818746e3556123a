"""Why an answer failed: its failure kind, read from the components an evaluation computed.

An answer labelled below ``directly_addresses`` gets one of :data:`FAILURE_KINDS`, each pointing
at a part of a RAG app:

* ``echo``: the answer restates the question (generation failed: the model returned its input);
* ``hedge``: the answer says the sources do not answer it (retrieval missed the documents);
* ``evasive``: a non-committal reply ("it depends", "hard to say"): the prompt lets the model
  dodge, or the question is out of scope;
* ``off_topic``: the answer addresses another question (wrong documents retrieved);
* ``padded``: the answer is buried in unrelated text (irrelevant context copied into it);
* ``incomplete``: on topic, but part of the question is not answered;
* ``other``: none of the above could be told (or the method computes too little to tell).

No model call is added. The rules (:data:`RULES`, a decision list, first match wins) read the
default method's components: ``novelty`` (share of the answer that is not the question's
words), ``answer_similarity`` (the answer's embedding similarity to the question), the
generated questions' ``similarities`` and noncommittal flags, and two more cosine
similarities of the answer's embedding, already computed for ``answer_similarity``, to fixed
example sentences (:data:`SOURCE_REFUSALS`, :data:`EVASIONS`): ``refusal_sources`` and
``refusal_evasion``. The thresholds were chosen on the development pair sets' fit subsets, whose
variants' kinds are known, and checked on the held-out rest (docs/calibration.md, figures from
``python -m benchmarks.failure_kinds``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

#: The failure kinds, in the order the rules try them (``other`` last).
FAILURE_KINDS = ("echo", "hedge", "evasive", "off_topic", "padded", "incomplete", "other")

#: Kinds that do not address the question at all: their label is ``does_not_address``
#: whatever the score (an echo or a hedge restates the question, so its topicality is high).
NOT_ADDRESSING = frozenset({"echo", "hedge", "evasive", "off_topic"})

#: What each kind says, appended to the label's explanation.
EXPLANATIONS = {
    "echo": "it restates the question",
    "hedge": "it says the sources do not answer it",
    "evasive": "it is non-committal",
    "off_topic": "it answers another question",
    "padded": "the answer is buried in unrelated text",
    "incomplete": "part of the question is not answered",
    "other": "no single cause was found",
}

#: Example replies of an app whose retrieval found nothing (what a RAG prompt's "if the
#: context does not contain the answer, say you don't know" produces), English and Chinese.
SOURCE_REFUSALS = (
    "The documents do not contain the answer to this question.",
    "I could not find this information in the available sources.",
    "The documentation does not cover that.",
    "The provided context does not mention it.",
    "I don't know; the context does not contain the answer.",
    "我不知道，资料里没有答案。",
    "文档中没有这个问题的答案。",
    "在提供的资料里找不到相关信息。",
)

#: Example non-committal replies that do not blame the sources.
EVASIONS = (
    "It depends on the situation.",
    "I would rather not say.",
    "That is a matter of opinion.",
    "要看情况而定。",
    "这个不好说。",
)

#: The decision list's thresholds (cosine similarities and shares in [0, 1]):
#: ``echo`` when novelty < echo_novelty; a refusal (``hedge`` when it blames the sources by
#: source_margin or names the question, else ``evasive``) when the answer is within refusal of
#: an example reply or most generated questions are noncommittal; ``hedge`` when novelty <
#: hedge_novelty (the question's words with little else); ``off_topic`` when neither the answer
#: nor any generated question comes within off_topic_similarity of the question; ``padded``
#: when the answer as a whole stays under padded_similarity; else ``incomplete``.
RULES = {
    "echo_novelty": 0.15,
    "refusal": 0.22,
    "source_margin": 0.1,
    "names_question": 0.5,
    "noncommittal_share": 0.5,
    "hedge_novelty": 0.5,
    "off_topic_similarity": 0.4,
    "padded_similarity": 0.4,
}


def failure_kind(components: Mapping[str, float], similarities: Sequence[float] = (), noncommittal: Sequence[bool] = ()) -> str:
    """The failure kind (one of :data:`FAILURE_KINDS`) of an answer that did not directly
    address its question, from an evaluation's components (see the module docstring).

    Args:
        components: the evaluation's components; reads ``novelty``, ``answer_similarity``,
            ``refusal_sources`` and ``refusal_evasion`` (the last two optional).
        similarities: the generated questions' cosine similarities to the question.
        noncommittal: the generated questions' noncommittal flags.

    Returns ``other`` when ``novelty`` or ``answer_similarity`` is missing (methods that do
    not compute them). Never raises for missing or non-finite values.
    """
    novelty = _finite(components.get("novelty"))
    answer_sim = _finite(components.get("answer_similarity"))
    if novelty is None or answer_sim is None:
        return "other"
    sources = _finite(components.get("refusal_sources"))
    evasion = _finite(components.get("refusal_evasion"))
    flags = list(noncommittal)
    sims = [s for s in (_finite(x) for x in similarities) if s is not None]
    if novelty < RULES["echo_novelty"]:
        return "echo"
    refusing = max(sources or 0.0, evasion or 0.0) >= RULES["refusal"] or (bool(flags) and sum(flags) / len(flags) >= RULES["noncommittal_share"])
    if refusing:
        blames_sources = sources is not None and sources - (evasion or 0.0) >= RULES["source_margin"]
        return "hedge" if blames_sources or answer_sim >= RULES["names_question"] else "evasive"
    if novelty < RULES["hedge_novelty"]:
        return "hedge"
    if max([answer_sim] + sims) < RULES["off_topic_similarity"]:
        return "off_topic"
    if answer_sim < RULES["padded_similarity"]:
        return "padded"
    return "incomplete"


def fingerprint() -> dict[str, Any]:
    """What determines a failure kind (part of the evaluator version)."""
    return {"rules": RULES, "sources": SOURCE_REFUSALS, "evasions": EVASIONS}


def _finite(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None
