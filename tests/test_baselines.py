"""Tests for programs.baselines: mark-all, token-to-offset mapping and the logit baseline.

Expected probabilities are hand-computed (arithmetic in comments); offsets come from ``str.index``.
"""

from __future__ import annotations

import math

import dspy
import pytest

from halluscope.programs import registry
from halluscope.programs.baselines.program import LogitBaseline, MarkAll, token_bytes, token_offsets


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


# ==================================================================================================
# MarkAll
# ==================================================================================================


def test_mark_all_whole_answer_minus_surrounding_whitespace():
    answer = "  Hello world. \n"
    s = answer.index("Hello")
    e = answer.index(".") + 1
    p = MarkAll()(answer=answer)
    assert isinstance(p, dspy.Prediction)
    assert p.spans == [{"start": s, "end": e, "prob": 1.0}]
    assert answer[s:e] == "Hello world."
    assert p.hard_labels == [[s, e]]
    assert p.soft_labels == [{"start": s, "end": e, "prob": 1.0}]
    assert p.label is True and p.score == 1.0


def test_mark_all_answer_without_whitespace():
    p = MarkAll()(answer="x")
    assert p.hard_labels == [[0, 1]] and p.label is True


def test_mark_all_internal_newlines_kept():
    answer = "Line one.\n\nLine two."
    p = MarkAll()(answer=answer, question="ignored", lang="en")
    assert p.hard_labels == [[0, len(answer)]]


@pytest.mark.parametrize("answer", ["", "   ", "\n\t ", None])
def test_mark_all_blank_answer(answer):
    p = MarkAll()(answer=answer)
    assert p.spans == [] and p.hard_labels == [] and p.soft_labels == []
    assert p.label is False and p.score == 0.0


def test_mark_all_no_arguments():
    p = MarkAll()()
    assert p.spans == [] and p.label is False


# ==================================================================================================
# token_bytes
# ==================================================================================================


def test_token_bytes_gpt2_byte_level():
    assert token_bytes("Ċ", True) == b"\n"
    assert token_bytes("Ġspanische", True) == b" spanische"
    assert token_bytes("Die", True) == b"Die"
    # "ß" is UTF-8 C3 9F: byte-level symbols "Ã" (0xC3) and "Ł" (0x9F -> U+0141)
    assert token_bytes("ĠheiÃŁt", True) == " heißt".encode("utf-8") == b" hei\xc3\x9ft"
    # "Á" is UTF-8 C3 81, split over two tokens: "ĠÃ" = space + 0xC3, "ģ" = 0x81
    assert token_bytes("ĠÃ", True) == b" \xc3"
    assert token_bytes("ģ", True) == b"\x81"
    assert token_bytes("ĠÃ", True)[1:] + token_bytes("ģ", True) == "Á".encode("utf-8")


def test_token_bytes_sentencepiece_and_plain():
    assert token_bytes("▁Hello", False) == b" Hello"
    assert token_bytes("<0x0A>", False) == b"\n"
    assert token_bytes("<0x0A>", True) == b"\n"  # byte tokens win over byte-level decoding
    assert token_bytes("<0xC3>", False) == b"\xc3"
    assert token_bytes("Álava", False) == "Álava".encode("utf-8")
    assert token_bytes("plain text", False) == b"plain text"


@pytest.mark.parametrize("tok", ["<|endoftext|>", "</s>", "<s>", "<|eot_id|>", "<|im_end|>", "<eos>", "<pad>"])
def test_token_bytes_special_tokens_are_empty(tok):
    assert token_bytes(tok, True) == b""
    assert token_bytes(tok, False) == b""


def test_token_bytes_malformed_byte_token_is_text():
    # "<0xZZ>" is not hex: treated as plain text
    assert token_bytes("<0xZZ>", False) == b"<0xZZ>"


# ==================================================================================================
# token_offsets
# ==================================================================================================

MUSHROOM_ANSWER = "\nDie spanische Provinz heißt Álava."
MUSHROOM_TOKENS = ["Ċ", "Die", "Ġspanische", "ĠProvinz", "ĠheiÃŁt", "ĠÃ", "ģ", "lava", ".", "<|endoftext|>"]


def test_token_offsets_gpt2_byte_level_with_split_character():
    a = MUSHROOM_ANSWER
    offs = token_offsets(a, MUSHROOM_TOKENS)
    assert len(offs) == len(MUSHROOM_TOKENS)
    die = a.index("Die")
    sp = a.index(" spanische")
    pr = a.index(" Provinz")
    he = a.index(" heißt")
    aa = a.index("Á")
    la = a.index("lava")
    dot = a.index(".")
    assert offs == [
        (0, 1),  # "\n"
        (die, die + 3),
        (sp, sp + len(" spanische")),
        (pr, pr + len(" Provinz")),
        (he, he + len(" heißt")),  # 6 characters, 7 bytes
        (aa - 1, aa + 1),  # " " + first byte of "Á": the space and the whole character
        (aa, aa + 1),  # second byte of "Á": the whole character again
        (la, la + 4),
        (dot, dot + 1),
        None,  # <|endoftext|>
    ]
    assert [a[o[0]:o[1]] if o else None for o in offs] == [
        "\n", "Die", " spanische", " Provinz", " heißt", " Á", "Á", "lava", ".", None]


def test_token_offsets_sentencepiece_with_byte_token():
    a = "Hello world\nBye"
    toks = ["▁Hello", "▁world", "<0x0A>", "Bye", "</s>"]
    offs = token_offsets(a, toks)
    nl = a.index("\n")
    w = a.index(" world")
    # "▁Hello" is b" Hello" but the answer starts without a space: the leading space is dropped
    assert offs == [(0, 5), (w, w + 6), (nl, nl + 1), (nl + 1, len(a)), None]


def test_token_offsets_sentencepiece_non_ascii():
    a = "Álava es una provincia"
    toks = ["▁Á", "lava", "▁es", "▁una", "▁provincia"]
    offs = token_offsets(a, toks)
    assert [a[o[0]:o[1]] for o in offs] == ["Á", "lava", " es", " una", " provincia"]


def test_token_offsets_plain_tokens():
    a = "foo bar baz"
    offs = token_offsets(a, ["foo", " bar", " baz"])
    assert offs == [(0, 3), (a.index(" bar"), a.index(" bar") + 4), (a.index(" baz"), len(a))]


def test_token_offsets_tokens_beyond_end_are_none():
    a = "foo bar baz"
    offs = token_offsets(a, ["foo", " bar", " baz", " qux", "zzz"])
    assert offs[:3] == [(0, 3), (3, 7), (7, 11)]
    assert offs[3:] == [None, None]


def test_token_offsets_skips_uncovered_text_within_lookahead():
    # the tokens do not cover "ab " at the start: "cd" is found 3 bytes ahead
    a = "ab cd ef"
    offs = token_offsets(a, ["cd", " ef"])
    assert offs == [(a.index("cd"), a.index("cd") + 2), (a.index(" ef"), len(a))]


def test_token_offsets_token_too_far_ahead_is_none():
    # lookahead is len(token) + 8 bytes from the cursor: "zz" 20 bytes later is not reached
    a = "x" * 20 + "zz"
    assert token_offsets(a, ["zz"]) == [None]


def test_token_offsets_unfound_token_does_not_move_cursor():
    a = "one two"
    offs = token_offsets(a, ["one", " nope", " two"])
    assert offs == [(0, 3), None, (3, 7)]


def test_token_offsets_cjk_split_bytes_gpt2():
    # "中" is UTF-8 E4 B8 AD; a byte-level tokenizer may split it into "ä¸" (E4 B8) + "Ń" (AD).
    a = "中文"
    toks = ["ä¸", "Ń", "æĸĩ"]  # "文" is E6 96 87 -> "æ" "ĸ" "ĩ"
    assert token_bytes("ä¸", True) + token_bytes("Ń", True) == "中".encode("utf-8")
    assert token_bytes("æĸĩ", True) == "文".encode("utf-8")
    assert token_offsets(a, toks) == [(0, 1), (0, 1), (1, 2)]


def test_token_offsets_empty():
    assert token_offsets("abc", []) == []
    assert token_offsets("", ["a"]) == [None]


def test_token_offsets_nfd_tokens_on_nfc_answer():
    # tokens in decomposed form ("e" + U+0301) against a precomposed answer: NFC fallback finds "é"
    a = "café"
    offs = token_offsets(a, ["caf", "e\u0301"])
    assert offs == [(0, 3), (3, 4)]


# ==================================================================================================
# LogitBaseline
# ==================================================================================================


def test_logit_baseline_hand_computed_probabilities():
    answer = "The cat sat badly"
    tokens = ["The", " cat", " sat", " badly"]
    logits = [10, 10, 10, 2]
    # mean = 32 / 4 = 8; deviations 2, 2, 2, -6; population variance = (4*3 + 36) / 4 = 12; sd = sqrt(12)
    # tokens at 10: z = (8 - 10) / 3.4641 = -0.57735 -> Phi = 0.28185
    # token at 2:   z = (8 - 2) / 3.4641 = 1.73205   -> Phi = 0.95837
    p = LogitBaseline()(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    probs = [s["prob"] for s in p.spans]
    assert probs[:3] == pytest.approx([0.2819] * 3, abs=1e-3)
    assert probs[3] == pytest.approx(0.9584, abs=1e-3)
    assert probs[3] == pytest.approx(_phi(6 / math.sqrt(12)), abs=1e-6)
    # spans are each token's characters with the leading space trimmed
    starts = [0, answer.index("cat"), answer.index("sat"), answer.index("badly")]
    ends = [3, starts[1] + 3, starts[2] + 3, len(answer)]
    assert [(s["start"], s["end"]) for s in p.spans] == list(zip(starts, ends))
    # hard labels: exactly "badly"
    b = answer.index("badly")
    assert p.hard_labels == [[b, len(answer)]]
    assert answer[b:len(answer)] == "badly"
    assert p.label is True
    assert p.score == pytest.approx(0.9584, abs=1e-3)
    assert p.failures == {}


def test_logit_baseline_shift_lowers_probabilities():
    answer = "The cat sat badly"
    tokens = ["The", " cat", " sat", " badly"]
    logits = [10, 10, 10, 2]
    base = LogitBaseline()(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    shifted = LogitBaseline(shift=1.0)(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    # shift 1: Phi(-0.57735 - 1) = Phi(-1.57735) = 0.05736; Phi(1.73205 - 1) = Phi(0.73205) = 0.76793
    sp = [s["prob"] for s in shifted.spans]
    assert sp[:3] == pytest.approx([0.0574] * 3, abs=1e-3)
    assert sp[3] == pytest.approx(0.7679, abs=1e-3)
    assert all(a["prob"] < b["prob"] for a, b in zip(shifted.spans, base.spans))
    # a big shift removes every hard label: Phi(1.732 - 2) = Phi(-0.268) = 0.394 < 0.5
    big = LogitBaseline(shift=2.0)(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    assert big.hard_labels == [] and big.label is False
    assert big.score == pytest.approx(_phi(6 / math.sqrt(12) - 2), abs=1e-6)


def test_logit_baseline_equal_logits_all_half_no_hard_labels():
    # sd = 0 -> replaced by 1; every z = 0 -> Phi(0) = 0.5, not > 0.5
    answer = "a b c"
    p = LogitBaseline()(answer=answer, model_output_tokens=["a", " b", " c"], model_output_logits=[5, 5, 5])
    assert [s["prob"] for s in p.spans] == [0.5, 0.5, 0.5]
    assert p.hard_labels == [] and p.label is False and p.score == 0.5


def test_logit_baseline_ignores_whitespace_and_special_tokens_in_statistics():
    # "\n" (Ċ) and <|endoftext|> are not scored: stats over the other two tokens only.
    # logits 4 and 0: mean 2, sd 2 -> z = -1 and +1 -> Phi = 0.15866 and 0.84134
    answer = "\nHi there"
    tokens = ["Ċ", "Hi", "Ġthere", "<|endoftext|>"]
    p = LogitBaseline()(answer=answer, model_output_tokens=tokens, model_output_logits=[-100.0, 4.0, 0.0, 50.0])
    t = answer.index("there")
    h = answer.index("Hi")
    assert [(s["start"], s["end"]) for s in p.spans] == [(h, h + 2), (t, t + 5)]
    assert [s["prob"] for s in p.spans] == pytest.approx([_phi(-1), _phi(1)], abs=1e-6)
    assert p.hard_labels == [[t, t + 5]]
    assert p.failures == {}  # special token is not an unmapped token


def test_logit_baseline_mushroom_tokens_split_character():
    a = MUSHROOM_ANSWER
    logits = [0.0, 10.0, 10.0, 10.0, 10.0, 1.0, 1.0, 10.0, 10.0, 0.0]
    p = LogitBaseline()(answer=a, model_output_tokens=MUSHROOM_TOKENS, model_output_logits=logits)
    # scored tokens: Die, spanische, Provinz, heißt, "Á"(x2), lava, "." -> logits 10,10,10,10,1,1,10,10
    # ("\n" is whitespace-only and <|endoftext|> unmapped: both unscored)
    # sum = 6*10 + 2*1 = 62, mean 7.75; deviations 2.25 (x6), -6.75 (x2)
    # variance = (6*5.0625 + 2*45.5625) / 8 = (30.375 + 91.125) / 8 = 15.1875; sd = 3.89711
    # "Á": z = 6.75 / 3.89711 = 1.73205 -> 0.95837; others z = -2.25 / 3.89711 = -0.57735 -> 0.28185
    aa = a.index("Á")
    la = a.index("lava")
    assert p.hard_labels == [[aa, aa + 1]]
    # both halves of "Á" map to the character; " Á" loses its leading space -> the same span twice
    assert [(s["start"], s["end"]) for s in p.spans if s["start"] == aa] == [(aa, aa + 1), (aa, aa + 1)]
    assert len(p.spans) == 8
    spans = {(s["start"], s["end"]): s["prob"] for s in p.spans}
    assert spans[(aa, aa + 1)] == pytest.approx(0.9584, abs=1e-3)
    assert spans[(la, la + 4)] == pytest.approx(0.2819, abs=1e-3)
    # soft labels: "lava" and "." have equal probability and touch -> one run "lava."
    soft = {(s["start"], s["end"]): s["prob"] for s in p.soft_labels}
    assert soft[(la, la + 5)] == pytest.approx(0.2819, abs=1e-3)
    assert a[la:la + 5] == "lava."
    assert p.failures == {}


@pytest.mark.parametrize(
    "tokens, logits",
    [
        (["a", " b"], [1.0, 2.0, 3.0, 4.0, 5.0]),  # lengths too different to align (a small gap is aligned)
        (["a", " b"], None),  # missing logits
        (["a", " b"], []),
        (None, [1.0, 2.0]),  # missing tokens
        ([], []),
    ],
)
def test_logit_baseline_missing_or_mismatched_logits(tokens, logits):
    p = LogitBaseline()(answer="a b", model_output_tokens=tokens, model_output_logits=logits)
    assert p.spans == [] and p.hard_labels == []
    assert p.failures == {"no_logits": 1}
    assert p.label is False and p.score == 0.0


@pytest.mark.parametrize("answer", ["", "   ", None])
def test_logit_baseline_empty_answer_no_failure(answer):
    p = LogitBaseline()(answer=answer, model_output_tokens=None, model_output_logits=None)
    assert p.spans == [] and p.failures == {}
    p = LogitBaseline()(answer=answer, model_output_tokens=["a"], model_output_logits=[1.0])
    assert p.spans == [] and p.failures == {}


def test_logit_baseline_unmapped_tokens():
    # no token is found in the answer -> no spans, failure counts every token
    p = LogitBaseline()(answer="hello", model_output_tokens=["xyz", "qqq"], model_output_logits=[1.0, 2.0])
    assert p.spans == [] and p.failures == {"unmapped_tokens": 2}


def test_logit_baseline_partially_unmapped_tokens_counted():
    # " nope" cannot be mapped; the special token is not counted as unmapped
    p = LogitBaseline()(answer="one two", model_output_tokens=["one", " nope", " two", "</s>"],
                        model_output_logits=[1.0, 2.0, 3.0, 4.0])
    assert p.failures == {"unmapped_tokens": 1}
    # scored: "one" (1.0) and " two" (3.0): mean 2, sd 1 -> Phi(1) for "one", Phi(-1) for "two"
    assert [s["prob"] for s in p.spans] == pytest.approx([_phi(1), _phi(-1)], abs=1e-6)


def test_logit_baseline_string_logits_are_parsed():
    answer = "The cat sat badly"
    p = LogitBaseline()(answer=answer, model_output_tokens=["The", " cat", " sat", " badly"],
                        model_output_logits=["10", "10", "10", "2"])
    assert p.hard_labels == [[answer.index("badly"), len(answer)]]


# ==================================================================================================
# registry
# ==================================================================================================


def test_registry_entries():
    logits = registry.get_program("logits")
    assert logits.extra_inputs == ("model_output_tokens", "model_output_logits")
    assert logits.uses_lm is False
    assert logits.options == {"shift": 0.0}
    mark_all = registry.get_program("mark-all")
    assert mark_all.uses_lm is False
    assert mark_all.extra_inputs == ()
    assert {"logits", "mark-all"} <= set(registry.program_names())


def test_registry_builds_modules():
    assert isinstance(registry.get_program("mark-all").build(), MarkAll)
    m = registry.get_program("logits").build(shift="1.5")
    assert isinstance(m, LogitBaseline) and m.shift == 1.5
    assert registry.get_program("logits").build().shift == 0.0


def test_registry_unknown_name():
    with pytest.raises(KeyError):
        registry.get_program("no-such-program")


def test_plain_tokens_with_latin1_letters_are_not_byte_level():
    a = "Ich heiße Max"
    h = a.index("heiße")
    assert token_offsets(a, ["Ich", "heiße", "Max"]) == [(0, 3), (h, h + 5), (a.index("Max"), len(a))]
    assert token_offsets("Álava", ["Álava"]) == [(0, 5)]
