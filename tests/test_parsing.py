"""Robust reply parsing: JSON in prose or code fences, numbers and flags as models write them."""

from __future__ import annotations

import pytest

from relevancy_tracer.result import Status
from relevancy_tracer.scoring.language import script_language
from relevancy_tracer.scoring.parsing import CutJSON, ReplyError, close_cut_json, extract_json, read_flag, read_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"score": 7}', {"score": 7}),
        ('```json\n{"score": 7}\n```', {"score": 7}),
        ('Here you go:\n```\n{"a": [1, 2]}\n```\nThanks!', {"a": [1, 2]}),
        ('The answer is {"score": 3} as requested.', {"score": 3}),
        ("[1, 2, 3] trailing", [1, 2, 3]),
        ('prefix {broken {"ok": true}', {"ok": True}),
    ],
)
def test_extract_json(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # a question string that ran out of tokens is closed and kept
        ('{"questions": ["Where is France?", "What is the capital of Fra', {"questions": ["Where is France?", "What is the capital of Fra"]}),
        ('{"questions": ["A?", "B?"], "noncommittal": [0, ', {"questions": ["A?", "B?"], "noncommittal": [0]}),
        ('{"questions": ["A?", "B?"], "noncom', {"questions": ["A?", "B?"]}),
        ('{"questions": ["A?", "B?"], "noncommittal": ', {"questions": ["A?", "B?"]}),
        ('{"questions": ["A \\"quoted\\" wor', {"questions": ['A "quoted" wor']}),
        ('{"questions": ["A?\\', {"questions": ["A?"]}),  # cut inside an escape
        ('```json\n{"intent": "the user wants', {"intent": "the user wants"}),
        ('{"a": 1} trailing', {"a": 1}),
    ],
)
def test_a_cut_reply_is_closed_where_it_stopped(text, expected):
    value = close_cut_json(text)
    assert value == expected and isinstance(value, CutJSON)


@pytest.mark.parametrize("text", ["", "no json at all", "]"])
def test_a_cut_reply_without_json_is_a_named_failure(text):
    with pytest.raises(ReplyError) as info:
        close_cut_json(text)
    assert info.value.status == Status.INVALID_JSON


@pytest.mark.parametrize("text", ["", "   ", "no json here", "{not: json}"])
def test_extract_json_failure_is_named(text):
    with pytest.raises(ReplyError) as info:
        extract_json(text)
    assert info.value.status == Status.INVALID_JSON


@pytest.mark.parametrize("value, expected", [(7, 7.0), (0.5, 0.5), ("8", 8.0), (" 8.5 ", 8.5), ("8/10", 8.0)])
def test_read_number(value, expected):
    assert read_number(value, 0, 10) == expected


@pytest.mark.parametrize("value", ["N/A", "high", "7 or 8", "", None, True, float("nan"), 11, -1, [7]])
def test_unreadable_number_is_a_named_failure_not_a_fallback(value):
    with pytest.raises(ReplyError) as info:
        read_number(value, 0, 10)
    assert info.value.status == Status.UNREADABLE_SCORE


@pytest.mark.parametrize("value, expected", [(0, False), (1, True), (True, True), ("1", True), ("no", False), ("Yes", True)])
def test_read_flag(value, expected):
    assert read_flag(value) is expected


@pytest.mark.parametrize("value", [2, "maybe", None])
def test_bad_flag(value):
    with pytest.raises(ReplyError):
        read_flag(value)


@pytest.mark.parametrize(
    "text, language",
    [("美国最高法院关于堕胎的裁决具有重要的全球影响。", "Chinese"), ("東京は日本の首都です。", "Japanese"), ("서울은 한국의 수도입니다.", "Korean"), ("Москва — столица России.", "Cyrillic"), ("Paris is the capital of France.", None), ("Paris est la capitale de la France.", None)],
)
def test_script_language(text, language):
    name = script_language(text)
    assert (name is None) if language is None else (language in name)
