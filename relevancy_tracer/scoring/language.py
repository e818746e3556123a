"""Which language to ask generated questions in.

Generated questions are asked for in the answer's language: a Chinese answer gets Chinese
questions, to be compared with a Chinese question.
Small local models ignore "use the answer's language" and follow the instruction's language
(English), but they follow an explicit name. So the answer's script is detected by Unicode range
and the language is named in the prompt; Latin-script answers keep the generic rule.
"""

from __future__ import annotations

from typing import Optional

# (name used in the prompt, ranges); checked in order, the first with enough letters wins.
_SCRIPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("Japanese (日本語)", ((0x3040, 0x30FF),)),  # kana: Japanese even when kanji dominate
    ("Korean (한국어)", ((0xAC00, 0xD7AF), (0x1100, 0x11FF))),
    ("Chinese (中文)", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("the answer's language, in Cyrillic script", ((0x0400, 0x04FF),)),
    ("Arabic (العربية)", ((0x0600, 0x06FF),)),
    ("Hebrew (עברית)", ((0x0590, 0x05FF),)),
    ("Greek (Ελληνικά)", ((0x0370, 0x03FF),)),
    ("Thai (ไทย)", ((0x0E00, 0x0E7F),)),
    ("Hindi (हिन्दी)", ((0x0900, 0x097F),)),
)


def script_language(text: str, min_share: float = 0.2) -> Optional[str]:
    """A language name for the prompt when ``text`` is mostly in a non-Latin script, else None.

    ``min_share``: minimum share of the text's letters in the script (Japanese needs only a few
    kana among kanji). Only the first 2,000 characters are looked at.
    """
    sample = text[:2000]
    letters = [ord(ch) for ch in sample if ch.isalpha()]
    if not letters:
        return None
    for name, ranges in _SCRIPTS:
        count = sum(1 for cp in letters if any(lo <= cp <= hi for lo, hi in ranges))
        share = count / len(letters)
        if (name.startswith("Japanese") and count >= 3 and share >= 0.05) or share >= min_share:
            return name
    return None


def language_rule(text: str) -> str:
    """The prompt line that tells the model which language to write questions in."""
    name = script_language(text)
    if name is None:
        return "Write the questions in the same language as the answer."
    return f"Write the questions in {name}, the language of the answer."
