"""Novelty and residual: what an answer says beyond the question (no model)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relevancy_tracer.scoring.restatement import novelty, residual

Q = "Why does floor paste wax dissolve dried spray adhesive?"
ZQ = "中国人民大学统计学专业的培养目标是什么？"


@pytest.mark.parametrize(
    "answer",
    [Q, Q + " " + Q, "Question: " + Q, "why does FLOOR paste wax dissolve dried spray adhesive.", ZQ, "问题：" + ZQ, ZQ + ZQ],
)
def test_an_echo_of_the_question_has_no_novelty_and_little_residual(answer):
    question = ZQ if ZQ in answer else Q
    assert novelty(question, answer) <= 0.2
    assert sum(ch.isalpha() for ch in residual(question, answer)) <= len("Question")  # at most a "Question:" label


def test_the_questions_numbers_go_with_its_words():
    question = 'Why are there prison sentences like "life plus 25 years"? They\'re already serving life, what\'s the 25 for?'
    assert residual(question, "Question: " + question) == "Question: \" \"? ' , ' ?"
    assert residual(question, "It adds 25 years to 1 life.") == "It adds to 1 ."


def test_a_hedge_keeps_only_its_template():
    hedge = f'Based on the context provided, there is no direct answer to the question "{Q}"'
    assert residual(Q, hedge) == 'Based on the context provided, there is no direct answer to the question " ?"'
    assert 0.2 < novelty(Q, hedge) < 0.6
    assert residual(ZQ, f"根据所提供的上下文，无法直接回答“{ZQ}”这个问题。") == "根据所提供的上下文，无法直接回答“？”这个问题。"


def test_an_answer_keeps_its_content():
    answer = "Paste wax contains mineral spirits and naphtha, solvents that soften the adhesive's polymer; the wax then lifts it."
    assert novelty(Q, answer) > 0.6  # paste, wax and adhesive are the question's words
    assert residual(Q, answer).startswith("contains mineral spirits and naphtha, solvents that soften the")
    assert novelty(ZQ, "培养具有扎实数学基础和数据分析能力的高级专门人才。") > 0.8


@given(st.text(max_size=60), st.text(max_size=120))
def test_novelty_is_a_share_and_the_residual_only_removes(question, answer):
    value = novelty(question, answer)
    assert 0.0 <= value <= 1.0
    rest = residual(question, answer)
    assert len(rest) <= len(answer) and (rest == "" or any(ch.isalpha() for ch in rest))
    assert residual(question, question) == "" and novelty(question, question) == 0.0
