"""The fast local decoding path: JSON stopping and prefixes (no model), and with the embedded
model: greedy output checked against llama-cpp-python's own evaluation (up to float ties), prompt-prefix reuse across interleaved
conversations, single-pass digit distributions, cancellation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from relevancy_tracer.models.local_decoding import JSONScanner, _pick, json_prefix
from relevancy_tracer.models.local_llm import MAX_COPY, MAX_COPY_CHARS, MAX_STRING_TOKENS, _ReplyLimits, copy_weight
from relevancy_tracer.scoring import prompts


@pytest.mark.parametrize(
    "prefix, pieces, closes_at",
    [
        ('{"score": ', ["4", "}"], 1),
        ('{"questions": ["', ['Why is "x"', ' {so} [odd]?', '", "b"', "], ", '"noncommittal": [0, 0]', "}"], 5),
        ('{"intent": "', ['The asker wants \\"it\\"', '."', "}", "trailing"], 2),
        ("", ["{", '"a": [1, {"b": "}"}]', "}"], 2),
    ],
)
def test_json_scanner_stops_when_the_opened_value_closes(prefix, pieces, closes_at):
    scanner = JSONScanner(prefix)
    results = [scanner.feed(piece) for piece in pieces]
    assert results.index(True) == closes_at and all(results[closes_at:])


def test_json_prefix_from_schemas():
    assert json_prefix(prompts.SCORE_SCHEMA) == '{"score": '
    assert json_prefix(prompts.questions_schema(3)) == '{"questions": ["'
    assert json_prefix(prompts.INTENT_SCHEMA) == '{"intent": "'
    assert json_prefix(prompts.coverage_schema(2)) == '{"addressed": ['
    assert json_prefix({"type": "array"}) == "" and json_prefix({"type": "object", "properties": {}}) == ""


class _Writer:
    """A toy greedy model for the reply limits: its vocabulary is byte pieces, it wants to write
    ``wanted`` (pieces) and the reply's closing quote is always its second choice."""

    def __init__(self, answer: str, answer_tokens: tuple = ()) -> None:
        self.vocab: list[bytes] = [b'"', b",", b"]", b" +"]
        self.scanner = JSONScanner('{"questions": ["')
        self.limits = _ReplyLimits(self.scanner, 0, {",": 1, "]": 2}, list(answer_tokens), answer, self.detokenize)
        self.generated: list[int] = []

    def token(self, piece: bytes) -> int:
        if piece not in self.vocab:
            self.vocab.append(piece)
        return self.vocab.index(piece)

    def detokenize(self, ids: list) -> str:
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    def write(self, wanted: list) -> str:
        """Decode until the string closes; returns the string's text."""
        ids = [self.token(piece) for piece in wanted] + [0]
        for want in ids:
            logits = np.zeros(len(self.vocab) + 8, dtype=np.float32)
            logits[0], logits[want] = 5.0, 10.0
            self.limits(self.generated, logits)
            chosen = int(np.argmax(logits))
            self.generated.append(chosen)
            self.scanner.feed(self.detokenize([chosen]))
            if not self.scanner.in_string:
                return self.detokenize(self.generated[:-1])
        raise AssertionError("the string never closed")


ZH_ANSWER = "经济学是一门解释经济现象、发现经济规律的学问，关注于人们观察经济现象、分析经济问题、做出个人选择和决策等。"


def _pieces(text: str, size: int) -> list:
    return [text[i : i + size].encode() for i in range(0, len(text), size)]


def test_a_string_copying_the_answers_chinese_text_is_closed_whatever_its_tokens():
    # two characters per token: not the answer's own tokenization, so the token rule cannot see it
    written = _Writer(ZH_ANSWER).write(_pieces(ZH_ANSWER, 2))
    # closed at the first check where the copy exceeds MAX_COPY_CHARS wide characters
    assert written == ZH_ANSWER[:22] and copy_weight(written) > MAX_COPY_CHARS >= copy_weight(written[:-2])


def test_a_string_is_never_closed_inside_a_character_being_written_byte_by_byte():
    # each character as two tokens (2 + 1 UTF-8 bytes): the copy is checked after every token
    pieces = [piece for ch in ZH_ANSWER for piece in (ch.encode()[:2], ch.encode()[2:])]
    written = _Writer(ZH_ANSWER).write(pieces)
    assert "\ufffd" not in written and written == ZH_ANSWER[: MAX_COPY_CHARS + 1]
    # the token budget too: after "x", one byte per token, so token MAX_STRING_TOKENS ends mid-character
    writer = _Writer("")
    written = writer.write([b"x"] + [bytes([b]) for b in ZH_ANSWER.encode()])
    assert written == "x" + ZH_ANSWER[:16] and len(writer.generated) - 1 == MAX_STRING_TOKENS + 1


@pytest.mark.parametrize(
    "answer, question",
    [
        # Chinese: 12 copied characters, then the question's own words
        (ZH_ANSWER, "经济学是一门解释经济现象的学问吗？它关注人们观察经济现象、分析经济问题的哪些方面？"),
        # English: a 60-character copy (15 of MAX_COPY_CHARS) inside a question
        (
            "The committee approved the new budget for the public library renovation after a long debate in March.",
            "Why did the committee approved the new budget for the public library renovation only in March?",
        ),
    ],
)
def test_a_question_that_quotes_part_of_the_answer_is_written_whole(answer, question):
    assert _Writer(answer).write(_pieces(question, 3)) == question


def test_a_long_english_copy_is_closed_past_max_copy_chars():
    answer = "The committee approved the new budget for the public library renovation after a long debate held in March of last year."
    written = _Writer(answer).write(_pieces(answer, 4))
    assert answer.startswith(written) and MAX_COPY_CHARS < copy_weight(written) <= MAX_COPY_CHARS + 1


def test_the_token_rule_and_the_string_budget_still_hold():
    answer_pieces = [f"w{i} ".encode() for i in range(40)]
    writer = _Writer("")  # no answer text: only the token rules apply
    answer_tokens = tuple(writer.token(piece) for piece in answer_pieces)
    writer = _Writer("", answer_tokens)
    for piece in answer_pieces:
        writer.token(piece)
    # copying the answer's tokens stops after MAX_COPY of them (here by closing the string)
    assert writer.write(answer_pieces) == b"".join(answer_pieces[:MAX_COPY]).decode()
    # an endless string that copies nothing is closed after MAX_STRING_TOKENS tokens
    writer = _Writer("")
    writer.scanner.feed('", "')
    assert len(writer.write([f"x{i}".encode() for i in range(100)])) == len("".join(f"x{i}" for i in range(MAX_STRING_TOKENS)))


def test_each_string_has_its_own_budget_when_one_token_closes_a_string_and_opens_the_next():
    # Qwen writes `","` as a single token: the scanner never leaves a string between questions
    first = [f"a{i} ".encode() for i in range(40)]
    second = [f"b{i} ".encode() for i in range(20)]
    written = _Writer("").write(first + [b'","'] + second)
    assert written == b"".join(first + [b'","'] + second).decode()  # neither question cut
    # and the copy check measures the new string only: 8 wide characters copied in each
    answer = "经济学是一门解释经济现象、发现经济规律的学问"
    question = "经济学是一门解释经济现象？"
    assert _Writer(answer).write(_pieces(question, 2) + [b'","'] + _pieces(question, 2)) == question + '","' + question


def test_only_a_separator_may_follow_a_string_in_an_array():
    writer = _Writer("")
    writer.write([b"Why?"])
    logits = np.zeros(len(writer.vocab) + 8, dtype=np.float32)
    logits[3] = 10.0  # the model wants ` +` (continuing a cut string)
    writer.limits(writer.generated, logits)
    assert int(np.argmax(logits)) in (1, 2) and np.isinf(logits[3])


@pytest.mark.parametrize(
    "prefix, written, allowed",
    [
        ('{"questions": ["', 'Why?"', ",]"),
        ('{"intent": "', 'The asker wants to know what it "', ",}"),  # an object's value
        ('{"intent": "x", "', 'note"', ":"),  # an object's key
        ('{"a": [{"b": "', 'c"', ",}"),  # a value in an object in an array
        ('{"a": [{"b": "c"}, "', 'd"', ",]"),
        ('{"a": "b", "c": {"', 'd"', ":"),
        ('"', 'top level"', ""),
        ('{"intent": "', 'unclosed', ""),
    ],
)
def test_the_scanner_knows_what_may_follow_a_closed_string(prefix, written, allowed):
    scanner = JSONScanner(prefix)
    scanner.feed(written)
    assert scanner.allowed_next == allowed
    scanner.feed("  ")  # whitespace keeps the constraint, anything else ends it
    assert scanner.allowed_next == allowed
    scanner.feed(allowed[:1] or "x")
    assert scanner.allowed_next == ""


def test_an_unescaped_quote_in_an_objects_value_ends_the_string_validly():
    # the intent statement of en-haluquestqa-89 quoted a phrase without escaping it, then went on
    # writing ("... it "dials in" new coordinates"), and the reply was invalid JSON
    vocab = [b'"', b",", b"}", b":", b"dials", b" in", b"It names what it"]
    scanner = JSONScanner('{"intent": "')
    limits = _ReplyLimits(scanner, 0, {",": 1, "}": 2, ":": 3}, [], "", lambda ids: b"".join(vocab[i] for i in ids).decode())
    generated: list[int] = []
    for want in [6, 0, 4, 5, 0]:  # the model's wishes: `It names what it`, `"`, `dials`, ` in`, `"`
        logits = np.zeros(len(vocab), dtype=np.float32)
        logits[2] = 5.0  # `}`: always its second choice
        logits[want] = 10.0
        limits(generated, logits)
        chosen = int(np.argmax(logits))
        generated.append(chosen)
        if scanner.feed(vocab[chosen].decode()):
            break
    text = '{"intent": "' + b"".join(vocab[i] for i in generated).decode()
    assert json.loads(text) == {"intent": "It names what it"} and scanner.done


def test_sampling_is_greedy_at_zero_and_seeded_otherwise():
    logits = np.asarray([0.0, 3.0, 2.9, -1.0, 2.0], dtype=np.float32)
    assert _pick(logits, 0.0, None) == 1
    draws = [_pick(logits, 0.8, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same draw
    spread = {_pick(logits, 1.0, np.random.default_rng(seed)) for seed in range(60)}
    # top-p 0.95 keeps the three likeliest tokens (0.43, 0.39, 0.16 of the mass): 1, 2 and 4
    assert {1, 2} <= spread <= {1, 2, 4}


# ------------------------------------------------------------------------------ with the model


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("llama_cpp", reason="needs the local extra")
    from relevancy_tracer.models.local_llm import LocalChatModel

    chat = LocalChatModel("qwen2.5-coder-1.5b", threads=2, n_ctx=4096)
    yield chat
    chat.close()


#: How far (in logits) a chosen token may sit below the reference's best one and still count as
#: greedy. Batch shapes, chunked prefill and a prefix reused from another request's KV cache sum
#: floats in another order, which flips near-ties: the same prompt evaluated after a cached
#: system message chose a token 0.43 below the one-shot evaluation's best (third question of a
#: joint_questions reply). A decoding bug (a wrong position, a stale KV cell, another sequence's
#: logits) moves logits by whole units, at most steps.
TIE = 0.5


def _assert_greedy_up_to_ties(model, prompt: list[int], generated: list[int]) -> None:
    """Teacher-force ``prompt + generated`` through llama-cpp-python's own evaluation in a fresh
    context (one sequence, every position's logits) and check each generated token is the
    reference's argmax up to :data:`TIE`, and that at most two steps are such ties."""
    import llama_cpp.llama_cpp as bindings
    from llama_cpp import Llama

    # The reference loads the weights as the model under test did (no repacking on AMX CPUs,
    # where it crashes): Llama has no argument for it, so its default parameters are wrapped.
    default_params = bindings.llama_model_default_params

    def params():
        value = default_params()
        value.use_extra_bufts = bool(model.repacked)
        return value

    bindings.llama_model_default_params = params
    try:
        fresh = Llama(model_path=model._llama.path_model, n_ctx=len(prompt) + len(generated) + 8, n_threads=2, logits_all=True, verbose=False)
    finally:
        bindings.llama_model_default_params = default_params
    try:
        fresh.eval(list(prompt) + list(generated))
        gaps = [float(fresh.scores[len(prompt) - 1 + i].max() - fresh.scores[len(prompt) - 1 + i][token]) for i, token in enumerate(generated)]
    finally:
        fresh.close()
    assert max(gaps) <= TIE and sum(gap > 1e-3 for gap in gaps) <= 2, (model._detokenize(generated), [round(g, 2) for g in gaps])


def _questions_prompt(model, answer: str) -> list[int]:
    """Prompt tokens of the default's first turn (3 joint questions) for ``answer``, up to the
    JSON prefix the decoder forces. Call with the model loaded (it tokenizes)."""
    return model._prompt_tokens(prompts.joint_questions(answer, 3), json_prefix(prompts.questions_schema(3)))


@pytest.mark.local_models
def test_greedy_reply_is_llama_cpp_python_greedy(model):
    with model._infer_lock:
        model._load()
        tokens = _questions_prompt(model, "France is in western Europe and Paris is its capital.")
        ours, _ = model._decoder.generate(tokens, max_tokens=24, detokenize=model._detokenize)
        assert len(ours) == 24 and model._detokenize(ours).strip()
        _assert_greedy_up_to_ties(model, tokens, ours)


@pytest.mark.local_models
def test_interleaved_conversations_reuse_their_prefixes(model):
    def conversation(answer: str) -> list[dict]:
        return prompts.direct_score("Where is France and what is its capital?", answer)

    answers = ["France is in western Europe and Paris is its capital.", "I don't know.", "Bananas are yellow."]
    import asyncio

    async def judge(answer: str) -> float:
        reply = await model.chat_json(conversation(answer), prompts.SCORE_SCHEMA, max_tokens=8, score_key="score")
        assert reply.score_probs and abs(sum(reply.score_probs.values()) - 1.0) < 1e-6
        return sum(d * p for d, p in reply.score_probs.items())

    sequential = [asyncio.run(judge(a)) for a in answers]
    before = model.stats.prompt_tokens, model.stats.cached_tokens, model.stats.shared_decode_calls

    async def interleaved() -> list[float]:
        return list(await asyncio.gather(*(judge(a) for a in answers)))

    again = asyncio.run(interleaved())
    prompt_tokens = model.stats.prompt_tokens - before[0]
    cached = model.stats.cached_tokens - before[1]
    # Batching and cache reuse change only how the prompt is split into decode calls. The split
    # alone moves a 1-5 expected value by up to ~0.04 (float summation order differs between
    # batch shapes: the same prompt in chunks of 256/64/32 tokens gave 3.621/3.641/3.599).
    assert np.allclose(again, sequential, atol=0.06)
    assert cached > prompt_tokens  # most of each prompt came from the slots
    assert model.stats.shared_decode_calls > before[2]  # the three requests shared decode calls
    assert sequential[0] > sequential[1] and sequential[0] > sequential[2]


@pytest.mark.local_models
def test_cancelled_generation_stops_and_the_model_stays_usable(model):
    cancelled = threading.Event()
    cancelled.set()
    from relevancy_tracer.models.base import ModelError

    with pytest.raises(ModelError):
        model._chat_sync(prompts.joint_questions("Paris is the capital of France.", 3), prompts.questions_schema(3), 64, 0.0, None, cancelled)
    reply = model._chat_sync(prompts.joint_questions("Paris is the capital of France.", 3), prompts.questions_schema(3), 160, 0.0, None, threading.Event())
    assert reply.text.startswith('{"questions": ["') and reply.finish_reason == "stop"


@pytest.mark.local_models
def test_concurrent_generations_are_batched_and_stay_greedy(model):
    """Two greedy generations decoded together share decode calls (fewer calls than tokens
    generated), and each is still the greedy reply to its own prompt: another sequence in the
    batch does not leak into its logits."""
    from relevancy_tracer.models.local_decoding import DecodeRequest

    answers = ["Paris is the capital of France and its largest city.", "Photosynthesis turns light, water and CO2 into sugar and oxygen."]
    with model._infer_lock:
        model._load()
        calls, shared, generated = model.stats.decode_calls, model.stats.shared_decode_calls, model.stats.generated_tokens
        prompts_ = [_questions_prompt(model, a) for a in answers]
        requests = [model._decoder.submit(DecodeRequest(tokens, 32, model._detokenize)) for tokens in prompts_]
        for request in requests:
            request.result(timeout=300)
        assert model.stats.shared_decode_calls - shared > 10
        assert model.stats.decode_calls - calls < model.stats.generated_tokens - generated
        for tokens, request in zip(prompts_, requests):
            assert request.generated and request.finish_reason in ("stop", "length")
            _assert_greedy_up_to_ties(model, tokens, request.generated)


@pytest.mark.local_models
def test_close_waits_for_queued_requests_then_frees(model):
    """close() lets queued and running requests finish, then frees; the next call reloads."""
    from relevancy_tracer.models.local_decoding import DecodeRequest

    messages = prompts.joint_questions("Paris is the capital of France.", 3)
    prefix = json_prefix(prompts.questions_schema(3))
    with model._infer_lock:
        model._load()
        decoder = model._decoder
        tokens = _questions_prompt(model, "Paris is the capital of France.")
        requests = [decoder.submit(DecodeRequest(tokens, 40, model._detokenize)) for _ in range(3)]
    assert model.close(timeout=120)
    assert all(r.done.is_set() and r.error is None and r.generated and r.finish_reason in ("stop", "length") for r in requests)
    assert model._decoder is None and decoder._closed
    with pytest.raises(RuntimeError):
        decoder.submit(DecodeRequest(tokens, 1))
    reply = model._chat_sync(messages, prompts.questions_schema(3), 40, 0.0, None, threading.Event())
    assert reply.text.startswith(prefix) and len(reply.text) > len(prefix) + 10


@pytest.mark.local_models
def test_a_reply_cut_by_its_token_budget_is_closed_and_kept(model):
    """The local decoder stops at max_tokens with finish_reason "length"; the parse path closes
    the question string it was writing and keeps it, with no re-ask."""
    import asyncio

    from relevancy_tracer.result import Usage
    from relevancy_tracer.scoring.methods import _questions_validator
    from relevancy_tracer.scoring.parsing import ask_json

    usage = Usage()
    messages = prompts.joint_questions("France is in western Europe and Paris is its capital.", 3)
    (questions, flags), reply = asyncio.run(ask_json(model, messages, prompts.questions_schema(3), _questions_validator(3), usage=usage, retries=1, max_tokens=12))
    assert reply.finish_reason == "length" and reply.output_tokens == 12
    assert usage.llm_calls == 1 and 1 <= len(questions) <= 3 and all(q.strip() for q in questions)
    assert reply.text.startswith('{"questions": ["' + questions[0][:5]) and flags == [False] * len(questions)
