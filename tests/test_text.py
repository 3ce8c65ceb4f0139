"""Tests for halluscope.core.text: quote mapping, sentence segmentation and word diffs.

Offsets are computed with ``str.index`` / ``str.find`` in the tests (never hand-typed where a string can
tell them); the reasoning is in comments.
"""

from __future__ import annotations

import time

import pytest

from halluscope.core.contract import Detection, Span
from halluscope.core.text import MappingStats, Segment, diff_spans, map_substrings, segment, word_spans


def _texts(text: str, spans) -> list[str]:
    return [text[s.start:s.end] for s in spans]


def _no_overlap(spans) -> bool:
    ss = sorted((s.start, s.end) for s in spans)
    return all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ss, ss[1:]))


# ==================================================================================================
# map_substrings: exact matches
# ==================================================================================================


def test_exact_matches_in_order():
    text = "Marie Curie won the Nobel Prize in 1911 in Stockholm."
    spans, stats = map_substrings(text, [("Nobel Prize", 0.9), ("1911", 0.6)])
    n, y = text.index("Nobel Prize"), text.index("1911")
    assert spans == [Span(n, n + len("Nobel Prize"), 0.9), Span(y, y + 4, 0.6)]
    assert (stats.exact, stats.fuzzy, stats.unmatched, stats.total) == (1 + 1, 0, 0, 2)
    assert stats.unmatched_strings == []


def test_repeated_string_maps_to_distinct_occurrences_in_order():
    text = "the cat and the dog"
    first = text.index("the")
    second = text.index("the", first + 1)
    assert (first, second) == (0, text.index("the dog"))
    spans, stats = map_substrings(text, ["the", "the"])
    assert spans == [Span(first, first + 3, 1.0), Span(second, second + 3, 1.0)]
    assert stats.exact == 2 and stats.unmatched == 0


def test_repeated_more_times_than_occurrences_leaves_extra_unmatched_without_overlap():
    text = "the cat and the dog"
    spans, stats = map_substrings(text, ["the", "the", "the"])
    # two occurrences only: the third quote cannot take a used occurrence (spans never overlap)
    assert [(s.start, s.end) for s in spans] == [(0, 3), (text.index("the dog"), text.index("the dog") + 3)]
    assert stats.exact == 2 and stats.unmatched == 1 and stats.unmatched_strings == ["the"]
    assert _no_overlap(spans)


def test_out_of_order_quotes_fall_back_to_unused_earlier_occurrence():
    text = "the cat and the dog"
    dog = text.index("dog")
    second_the = text.index("the dog")
    # "dog" moves the cursor to the end of the text; the next "the" has nothing after the cursor, so
    # the first unused occurrence anywhere (index 0) is taken; then the cursor is 3 and the next "the"
    # is the second one.
    spans, stats = map_substrings(text, ["dog", "the", "the"])
    assert spans == [Span(dog, dog + 3, 1.0), Span(0, 3, 1.0), Span(second_the, second_the + 3, 1.0)]
    assert stats.exact == 3
    assert _no_overlap(spans)


def test_cursor_skips_occurrence_before_previous_match():
    text = "A then B then A again"
    b = text.index("B")
    second_a = text.index("A", 1)
    spans, _ = map_substrings(text, ["B", "A"])
    # "A" is searched from the end of "B": the second A, not the first.
    assert spans == [Span(b, b + 1, 1.0), Span(second_a, second_a + 1, 1.0)]


def test_repeated_quotes_never_overlap():
    text = "no no no, yes no"
    spans, stats = map_substrings(text, ["no"] * 5)
    starts = [i for i in range(len(text)) if text.startswith("no", i)]
    assert len(starts) == 4
    assert sorted(s.start for s in spans) == starts
    assert stats.exact == 4 and stats.unmatched == 1
    assert _no_overlap(spans)


def test_overlapping_longer_quote_not_placed_on_used_text():
    text = "New York is in New York State."
    spans, _ = map_substrings(text, ["New York", "New York State"])
    first = text.index("New York")
    state = text.index("New York State")
    assert spans == [Span(first, first + 8, 1.0), Span(state, state + len("New York State"), 1.0)]
    assert _no_overlap(spans)


# ==================================================================================================
# map_substrings: repaired and fuzzy matches
# ==================================================================================================


def test_recased_quote_maps_case_insensitively():
    text = "The capital of France is Paris."
    i = text.index("Paris")
    spans, stats = map_substrings(text, ["paris"])
    assert spans == [Span(i, i + 5, 1.0)]
    assert stats.exact == 0 and stats.fuzzy == 1


def test_upper_cased_quote_on_lower_case_text():
    text = "paris is nice"
    spans, stats = map_substrings(text, ["PARIS"])
    assert spans == [Span(0, 5, 1.0)]
    assert stats.fuzzy == 1


def test_recased_with_non_ascii_same_length():
    text = "Dr. Müller kam."
    i = text.index("Müller")
    spans, _ = map_substrings(text, ["MÜLLER"])
    assert _texts(text, spans) == ["Müller"] and spans[0].start == i


def test_trimmed_quote_quotes_and_punctuation():
    text = "La provincia se llama Álava."
    i = text.index("Álava")
    spans, stats = map_substrings(text, ['"Álava."'])
    # '"Álava."' is not in text; trimmed of '"' and '.' it is "Álava" (5 code points)
    assert spans == [Span(i, i + 5, 1.0)]
    assert _texts(text, spans) == ["Álava"]
    assert stats.fuzzy == 1 and stats.exact == 0


def test_trimmed_quote_surrounding_spaces_and_cjk_punctuation():
    text = "他住在北京，工作在上海。"
    i = text.index("北京")
    spans, _ = map_substrings(text, ["「北京」 "])
    assert spans == [Span(i, i + 2, 1.0)]


def test_quote_with_trailing_punctuation_present_in_text_maps_exactly():
    text = "It is Álava."
    i = text.index("Álava.")
    spans, stats = map_substrings(text, ["Álava."])
    assert spans == [Span(i, i + 6, 1.0)] and stats.exact == 1


def test_fuzzy_one_character_typo_maps():
    text = "We visited the Eiffel Tower in Paris yesterday."
    target = "Eiffel Tower in Paris"  # 21 characters
    i = text.index(target)
    quote = "Eiffel Tovver in Paris"  # "w" -> "vv": a near-miss, not a substring
    assert quote not in text
    spans, stats = map_substrings(text, [(quote, 0.8)])
    assert spans == [Span(i, i + len(target), 0.8)]
    assert stats.fuzzy == 1 and stats.unmatched == 0


def test_fuzzy_substitution_typo_maps_to_whole_phrase():
    text = "We visited the Eiffel Tower in Paris yesterday."
    target = "the Eiffel Tower in Paris"
    i = text.index(target)
    # same length as target, one character substituted ("e" -> "o")
    spans, stats = map_substrings(text, ["the Eiffel Towor in Paris"])
    assert spans == [Span(i, i + len(target), 1.0)]
    assert stats.fuzzy == 1


def test_totally_different_string_is_unmatched():
    text = "We visited the Eiffel Tower in Paris yesterday."
    spans, stats = map_substrings(text, ["quantum chromodynamics", "Eiffel"])
    e = text.index("Eiffel")
    assert spans == [Span(e, e + 6, 1.0)]
    assert stats.unmatched == 1
    assert stats.unmatched_strings == ["quantum chromodynamics"]
    assert stats.exact == 1 and stats.total == 2


def test_threshold_parameter():
    text = "The Treaty of Westphalia was signed in 1648 by many states."
    target = "Treaty of Westphalia"
    i = text.index(target)
    quote = "Treaty of Westfalia"  # "ph" -> "f": similarity about 0.89
    spans, stats = map_substrings(text, [quote], threshold=0.8)
    assert stats.fuzzy == 1
    assert spans[0].start == i and text[spans[0].start:spans[0].end].startswith("Treaty of West")
    spans, stats = map_substrings(text, [quote], threshold=0.99)
    assert spans == [] and stats.unmatched == 1 and stats.unmatched_strings == [quote]


def test_threshold_rejects_near_match_at_099_but_default_accepts():
    text = "The Treaty of Westphalia was signed in 1648 by many states."
    target = "Treaty of Westphalia"
    i = text.index(target)
    quote = "Treaty of Wastphalia"  # one substitution in 20 characters: similarity 0.95
    spans, _ = map_substrings(text, [quote])  # default threshold 0.85
    assert spans == [Span(i, i + len(target), 1.0)]
    assert map_substrings(text, [quote], threshold=0.99)[0] == []
    assert map_substrings(text, [quote], threshold=0.8)[0] == [Span(i, i + len(target), 1.0)]


def test_fuzzy_not_attempted_for_very_short_quotes():
    text = "xyz Paris"
    # "Qa" vs "Pa": similarity 0.5, which a 0.5 threshold would accept; but a quote of 2 characters is
    # never matched fuzzily, so it is dropped.
    spans, stats = map_substrings(text, ["Qa"], threshold=0.5)
    assert spans == [] and stats.unmatched == 1
    # 3 characters are: the best alignment of "Pax" is "Pa" (Indel ratio 2*2 / (3+2) = 0.8; "Par" would
    # only give 2*2 / 6 = 0.667), which passes 0.6.
    spans, stats = map_substrings(text, ["Pax"], threshold=0.6)
    p = text.index("Pa")
    assert spans == [Span(p, p + 2, 1.0)] and stats.fuzzy == 1


def test_fuzzy_span_between_wide_spaces():
    text = "alpha   Eiffel Tower   beta"
    target = "Eiffel Tower"
    i = text.index(target)
    spans, _ = map_substrings(text, ["Eiffel Towor"])  # one substitution, same length as target
    assert spans and not text[spans[0].start].isspace() and not text[spans[0].end - 1].isspace()
    assert spans[0].start == i and spans[0].end == i + len(target)


def test_case_folding_that_changes_text_length_is_not_used():
    # "ß".casefold() == "ss" changes the length of the text: only exact matches are safe there.
    text = "Straße"
    spans, stats = map_substrings(text, ["STRASSE"])
    assert spans == [] and stats.unmatched == 1
    spans, stats = map_substrings(text, ["straße"])  # exact "traße" is not there; case fold not allowed ...
    # ... but fuzzy alignment still finds "traße" (5 of 6 chars).
    assert _texts(text, spans) == ["traße"]


# ==================================================================================================
# map_substrings: empty quotes, probabilities
# ==================================================================================================


def test_empty_whitespace_and_none_quotes_are_unmatched():
    text = "Some answer text."
    spans, stats = map_substrings(text, ["", "   ", ("", 0.5), (None, 0.3), ("\n\t", 1.0)])
    assert spans == []
    assert stats.unmatched == 5 and stats.exact == 0 and stats.fuzzy == 0
    # None becomes "" in unmatched_strings
    assert stats.unmatched_strings == ["", "   ", "", "", "\n\t"]


def test_empty_text_matches_nothing():
    spans, stats = map_substrings("", ["a", ("abc", 0.5)])
    assert spans == [] and stats.unmatched == 2


def test_no_quotes():
    spans, stats = map_substrings("abc", [])
    assert spans == [] and stats == MappingStats()
    assert stats.total == 0


def test_probabilities_outside_the_unit_interval_or_not_numbers_are_counted_invalid():
    """Issue #10: an invalid probability is not silently clamped or turned into 1.0; the quote is dropped and
    counted (``MappingStats.invalid``); a missing probability means 1.0 and a numeric string is read."""
    text = "We visited the Eiffel Tower in Paris yesterday."
    quotes = [("Paris", 1.7), ("Eiffel", -0.2), ("Tower", "x"), ("visited", None), ("yesterday", float("nan")),
              ("We", "0.25"), ("the", 0.4), ("in", True)]
    spans, stats = map_substrings(text, quotes)
    assert stats.exact == 3 and stats.unmatched == 0 and stats.invalid == 5
    by_text = {text[s.start:s.end]: s.prob for s in spans}
    assert by_text == {"visited": 1.0, "We": 0.25, "the": 0.4}


def test_plain_string_quotes_get_probability_one():
    text = "one two three"
    spans, _ = map_substrings(text, ["two", "three"])
    assert [s.prob for s in spans] == [1.0, 1.0]
    assert _texts(text, spans) == ["two", "three"]


def test_list_pairs_accepted_like_tuples():
    text = "one two three"
    spans, _ = map_substrings(text, [["two", 0.3]])
    assert spans == [Span(text.index("two"), text.index("two") + 3, 0.3)]


# ==================================================================================================
# map_substrings: non-Latin and Unicode
# ==================================================================================================


@pytest.mark.parametrize(
    "text, quote",
    [
        ("北京是中国的首都。上海是最大的城市。", "上海"),
        ("عاصمة مصر هي القاهرة.", "القاهرة"),
        ("भारत की राजधानी दिल्ली है।", "दिल्ली"),
        ("😀 emoji before Álava 😀", "Álava"),  # astral-plane emoji is ONE code point
    ],
)
def test_non_latin_offsets_are_code_points(text, quote):
    spans, stats = map_substrings(text, [quote])
    i = text.index(quote)
    assert spans == [Span(i, i + len(quote), 1.0)]
    assert text[spans[0].start:spans[0].end] == quote
    assert stats.exact == 1


def test_emoji_offsets_are_not_utf16_or_bytes():
    text = "😀😀 x"
    spans, _ = map_substrings(text, ["x"])
    # 2 emoji + space = 3 code points (not 5 UTF-16 units, not 9 bytes)
    assert spans == [Span(3, 4, 1.0)]


def test_decomposed_quote_maps_to_precomposed_text_via_nfc():
    text = "café au lait"  # precomposed "é" (U+00E9): "café" is 4 code points
    quote = "cafe\u0301"  # decomposed: 5 code points
    assert quote not in text
    spans, stats = map_substrings(text, [quote])
    # NFC(quote) == "café" is found exactly: the span is the 4 code points of the text
    assert spans == [Span(0, 4, 1.0)]
    assert text[0:4] == "café"
    assert stats.fuzzy == 1


def test_decomposed_quote_on_decomposed_text_is_exact():
    text = "cafe\u0301 au lait"
    spans, stats = map_substrings(text, ["cafe\u0301"])
    assert spans == [Span(0, 5, 1.0)] and stats.exact == 1


# ==================================================================================================
# map_substrings: long answers
# ==================================================================================================


def test_long_answer_quote_near_end_is_fast_and_correct():
    text = "lorem ipsum dolor sit amet " * 740 + "The Eiffel Tower is in Rome. End."
    assert len(text) > 20_000
    target = "The Eiffel Tower is in Rome"
    i = text.index(target)
    t0 = time.perf_counter()
    spans, stats = map_substrings(text, [(target, 0.9), "end."])
    elapsed = time.perf_counter() - t0
    # "end." is not in the text; trimmed to "end" it matches "End" case-insensitively (3 characters:
    # trimming is tried before re-casing the untrimmed quote).
    e = text.index("End.")
    assert spans == [Span(i, i + len(target), 0.9), Span(e, e + 3, 1.0)]
    assert stats.exact == 1 and stats.fuzzy == 1
    assert elapsed < 1.0


def test_long_answer_fuzzy_quote_near_end_is_fast():
    text = "x" * 19_990 + " Paris end"
    assert len(text) == 20_000
    i = text.index("Paris end")
    t0 = time.perf_counter()
    spans, stats = map_substrings(text, [("Parsi end", 0.5), "completely unrelated phrase"])
    elapsed = time.perf_counter() - t0
    assert spans == [Span(i, i + len("Paris end"), 0.5)]
    assert stats.fuzzy == 1 and stats.unmatched == 1
    assert elapsed < 1.0


# ==================================================================================================
# segment
# ==================================================================================================


def _check_segments(text: str, segs: list[Segment]) -> None:
    prev_end = 0
    for s in segs:
        assert text[s.start:s.end] == s.text
        assert s.text and s.text == s.text.strip()
        assert s.start >= prev_end  # in order, non-overlapping
        prev_end = s.end


def test_segment_english_sentences():
    text = "It rained. We stayed in. Then the sun came out!"
    segs = segment(text)
    _check_segments(text, segs)
    assert [s.text for s in segs] == ["It rained.", "We stayed in.", "Then the sun came out!"]
    assert [s.start for s in segs] == [0, text.index("We"), text.index("Then")]


def test_segment_question_and_exclamation():
    text = "Is it? Yes! Ok."
    assert [s.text for s in segment(text)] == ["Is it?", "Yes!", "Ok."]


def test_segment_abbreviation_stays_one_sentence():
    text = "Dr. Smith went home."
    assert segment(text) == [Segment(0, len(text), text)]


def test_segment_no_boundary_is_one_segment():
    text = "no boundary here"
    assert segment(text) == [Segment(0, len(text), text)]


@pytest.mark.parametrize("text", ["", " ", "   \n\t "])
def test_segment_empty_and_blank(text):
    assert segment(text) == []


def test_segment_surrounding_whitespace_excluded():
    text = "  Hello there.  How are you?  "
    segs = segment(text)
    _check_segments(text, segs)
    assert segs == [
        Segment(text.index("Hello"), text.index("Hello") + len("Hello there."), "Hello there."),
        Segment(text.index("How"), text.index("How") + len("How are you?"), "How are you?"),
    ]


def test_segment_leading_newline_keeps_offsets():
    text = "\nDie Hauptstadt ist Berlin. Sie liegt an der Spree."
    segs = segment(text, "de")
    _check_segments(text, segs)
    assert segs[0].start == 1 == text.index("Die")
    assert [s.text for s in segs] == ["Die Hauptstadt ist Berlin.", "Sie liegt an der Spree."]


def test_segment_german_abbreviation():
    text = "Paris ist schön. z. B. im Mai."
    segs = segment(text, "de")
    _check_segments(text, segs)
    # German rules know "z. B." (English rules would split after "z.")
    assert [s.text for s in segs] == ["Paris ist schön.", "z. B. im Mai."]


def test_segment_chinese_full_stop():
    text = "北京是中国的首都。上海是最大的城市。"
    segs = segment(text, "zh")
    _check_segments(text, segs)
    mid = text.index("上海")
    assert segs == [Segment(0, mid, text[:mid]), Segment(mid, len(text), text[mid:])]


def test_segment_hindi_danda():
    text = "भारत की राजधानी दिल्ली है। मुंबई बड़ा शहर है।"
    segs = segment(text, "hi")
    _check_segments(text, segs)
    assert len(segs) == 2 and segs[1].start == text.index("मुंबई")


def test_segment_repeated_sentences_get_distinct_offsets():
    text = "Yes. Yes. Yes."
    segs = segment(text)
    _check_segments(text, segs)
    assert [s.start for s in segs] == [0, 5, 10]  # "Yes. " is 5 characters
    assert all(s.text == "Yes." for s in segs)


@pytest.mark.parametrize("lang", ["fi", "sv", "xx", "", None, "EN", "De"])
def test_segment_unsupported_or_odd_language_falls_back(lang):
    text = "Helsinki on Suomen pääkaupunki. Se sijaitsee etelässä."
    segs = segment(text, lang)
    _check_segments(text, segs)
    assert [s.text for s in segs] == ["Helsinki on Suomen pääkaupunki.", "Se sijaitsee etelässä."]


def test_segment_newlines_separate_lines():
    text = "Line one\nLine two"
    segs = segment(text)
    _check_segments(text, segs)
    assert [s.text for s in segs] == ["Line one", "Line two"]
    assert segs[1].start == text.index("Line two")


# ==================================================================================================
# word_spans / diff_spans
# ==================================================================================================


def test_word_spans_words_and_punctuation():
    text = "Hi, Álava! 北京 x_y 3.5"
    got = [text[s:e] for s, e in word_spans(text)]
    # \w+ runs (Unicode, "_" included), each CJK character alone, single punctuation marks; spaces skipped
    assert got == ["Hi", ",", "Álava", "!", "北", "京", "x_y", "3", ".", "5"]
    assert word_spans(text)[2] == (text.index("Álava"), text.index("Álava") + 5)


def test_word_spans_empty():
    assert word_spans("") == [] and word_spans("  \n ") == []


def test_diff_identical_is_empty():
    assert diff_spans("The capital is Paris.", "The capital is Paris.") == []
    assert diff_spans("", "") == []


def test_diff_whitespace_only_change_is_empty():
    # words are identical, only spacing differs
    assert diff_spans("a b c", "a b  c") == []


def test_diff_one_replaced_word():
    a = "The capital is Lyon."
    i = a.index("Lyon")
    assert diff_spans(a, "The capital is Paris.") == [Span(i, i + 4, 1.0)]


def test_diff_deleted_word():
    a = "The capital is really Paris."
    i = a.index("really")
    assert diff_spans(a, "The capital is Paris.") == [Span(i, i + 6, 1.0)]


def test_diff_pure_insertion_is_empty():
    assert diff_spans("The capital is Paris.", "The capital is really Paris.") == []


def test_diff_multiple_changes_in_order():
    a = "Born in 1950 in Rome, died 2001."
    b = "Born in 1952 in Milan, died 2001."
    y, r = a.index("1950"), a.index("Rome")
    assert diff_spans(a, b, prob=0.7) == [Span(y, y + 4, 0.7), Span(r, r + 4, 0.7)]


def test_diff_multiword_replacement_is_one_span():
    a = "He lived in New York City for years."
    b = "He lived in Los Angeles for years."
    s = a.index("New")
    e = a.index("City") + len("City")
    assert diff_spans(a, b) == [Span(s, e, 1.0)]


def test_diff_punctuation_only_change():
    a = "Hello, world."
    i = a.rindex(".")
    assert diff_spans(a, "Hello, world!") == [Span(i, i + 1, 1.0)]


def test_diff_replacement_plus_insertion_marks_only_replaced():
    # "b" replaced by "x y": one replace opcode over "b" only
    a = "a b c"
    assert diff_spans(a, "a x y c") == [Span(a.index("b"), a.index("b") + 1, 1.0)]


def test_diff_everything_deleted():
    a = "Completely wrong."
    # delete over all three words ("Completely", "wrong", ".")
    assert diff_spans(a, "") == [Span(0, len(a), 1.0)]


def test_diff_spaced_cjk():
    a = "東京 は 日本 の 首都"
    assert diff_spans(a, "大阪 は 日本 の 首都") == [Span(0, 2, 1.0)]
    i = a.index("日本")
    assert diff_spans(a, "東京 は 中国 の 首都") == [Span(i, i + 2, 1.0)]


def test_diff_cjk_punctuation_change():
    a = "北京是首都。"
    i = a.index("。")
    assert diff_spans(a, "北京是首都！") == [Span(i, i + 1, 1.0)]


def test_diff_prob_passed_through():
    assert diff_spans("a b", "a c", prob=0.4) == [Span(2, 3, 0.4)]


def test_diff_spans_index_the_original_after_repeated_words():
    a = "the cat saw the dog"
    second_the = a.index("the", 1)
    d = a.index("dog")
    # "dog" -> "cow": only the last word changes; the repeated "the" is equal
    assert diff_spans(a, "the cat saw the cow") == [Span(d, d + 3, 1.0)]
    assert second_the < d


# -- regressions found by review (each failed before its fix) ----------------------------------------

def test_quote_longer_than_text_does_not_crash():
    spans, stats = map_substrings("Rome", ["The city is Rome"])
    assert spans == [Span(0, 4, 1.0)] and stats.fuzzy == 1


def test_casefold_that_lengthens_the_quote_gives_full_span():
    text = "die strasse ist lang"
    i = text.index("strasse")
    spans, _ = map_substrings(text, ["Straße"])
    assert spans == [Span(i, i + len("strasse"), 1.0)]


def test_bare_none_quote_is_unmatched():
    spans, stats = map_substrings("Some text", [None, "text"])
    assert stats.unmatched == 1 and [s.start for s in spans] == [5]


def test_precomposed_quote_on_decomposed_text():
    spans, _ = map_substrings("cafe\u0301 au lait", ["café"])
    assert spans == [Span(0, 5, 1.0)]


def test_fuzzy_deletion_typo_covers_whole_phrase():
    text = "We visited the Eiffel Tower in Paris yesterday."
    target = "the Eiffel Tower in Paris"
    i = text.index(target)
    spans, _ = map_substrings(text, ["the Eiffel Towr in Paris"])
    assert spans == [Span(i, i + len(target), 1.0)]


def test_diff_unspaced_chinese_marks_only_changed_characters():
    assert diff_spans("北京是中国的首都。", "上海是中国的首都。") == [Span(0, 2, 1.0)]


def test_segment_from_many_threads_at_once_gives_each_text_its_own_sentences():
    """pysbd's Segmenter keeps the text it is working on in the instance: one instance shared by threads (an
    evaluation's threads, FINCH's samplers, a server's requests) handed a text another thread's sentences, or none
    (FINCH then answered 'empty answer: nothing to check')."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from halluscope.core.text import segment

    texts = [f"Paris holds item {i}. It was moved there in {1900 + i}! Is it still there? Yes, item {i} is."
             for i in range(64)]
    want = [[(s.start, s.end) for s in segment(t, "en")] for t in texts]
    assert all(len(w) == 4 for w in want)
    start = threading.Barrier(8)

    def run(k):
        start.wait(timeout=30)
        return [[(s.start, s.end) for s in segment(texts[i], "en")]
                for i in range(k % 8, len(texts), 8) for _ in range(5)]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    for k, got in enumerate(results):
        expected = [want[i] for i in range(k % 8, len(texts), 8) for _ in range(5)]
        assert got == expected
