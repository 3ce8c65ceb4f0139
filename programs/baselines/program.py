"""Detectors that need no language model: reference points for every benchmark.

* ``mark-all``: the whole answer is hallucinated (probability 1).
* ``logits``: tokens the *generating* model itself found unlikely. Mu-SHROOM ships each answer's tokens
  (``model_output_tokens``) and their logits (``model_output_logits``); tokens are mapped to character
  offsets of the answer (:func:`token_offsets`) and each gets ``p = Phi((mean - logit) / sd - shift)``,
  the normal CDF of its negated z-score within the answer: an average token scores 0.5, one a standard
  deviation below the mean 0.84. Hard labels (p > 0.5) are therefore the below-average tokens with
  ``shift=0``; a positive ``shift`` marks fewer.
"""

from __future__ import annotations

import math
import unicodedata

import dspy

from halluscope.core.contract import Detection, Span, to_prediction
from halluscope.core.literals import TextValueError, parse_text_list
from halluscope.programs.registry import ProgramSpec, number, register_program

__all__ = ["MarkAll", "LogitBaseline", "token_bytes", "token_logit_lists", "token_offsets"]


class MarkAll(dspy.Module):
    """Marks the whole (non-blank) answer with probability 1."""

    def forward(self, answer: str = "", **_):
        answer = answer or ""
        if not answer.strip():
            return to_prediction(Detection(answer=answer, rationale="empty answer"))
        start = len(answer) - len(answer.lstrip())
        end = len(answer.rstrip())
        return to_prediction(Detection(answer=answer, spans=[Span(start, end, 1.0)], label=True, score=1.0,
                                       rationale="mark-all baseline"))


# -- tokens to offsets -----------------------------------------------------------------------------

def _gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE symbols back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_DECODER = _gpt2_byte_decoder()
_SPECIAL = ("<|endoftext|>", "<|im_end|>", "<|im_start|>", "</s>", "<s>", "<|eot_id|>", "<|end|>", "<eos>", "<pad>")


def token_bytes(token: str, byte_level: bool) -> bytes:
    """The bytes a generating model's token stands for.

    Handles GPT-2 style byte-level BPE (``Ġ`` = space, ``Ċ`` = newline, ``Ã`` + ``¤`` = one UTF-8
    character split over two tokens), SentencePiece (``▁`` = space, ``<0x0A>`` byte tokens) and plain text.
    Special tokens map to no bytes.
    """
    if token in _SPECIAL:
        return b""
    if token.startswith("<0x") and token.endswith(">") and len(token) == 6:
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    if byte_level:
        return bytes(_BYTE_DECODER[c] for c in token)
    return token.replace("▁", " ").encode("utf-8")


def _is_byte_level(tokens: list[str]) -> bool:
    """Whether tokens are GPT-2 byte-level BPE symbols: every character is in the byte alphabet and the
    decoded bytes are valid UTF-8 (plain tokens with Latin-1 letters such as "heiße" or "Álava" are in the
    alphabet too, but their bytes do not decode)."""
    body = [t for t in tokens if t not in _SPECIAL]
    if not body or not all(all(c in _BYTE_DECODER for c in t) for t in body):
        return False
    data = b"".join(bytes(_BYTE_DECODER[c] for c in t) for t in body)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(data) - 3 and e.reason == "unexpected end of data"  # a cut-off last character
    return True


def token_offsets(answer: str, tokens: list[str]) -> list[tuple[int, int] | None]:
    """Character offsets of each token in ``answer`` (None for tokens that are not in it).

    Tokens are turned into bytes (:func:`token_bytes`) and matched greedily, in order, against the UTF-8
    bytes of the answer, looking a few bytes ahead to skip text the tokens do not cover; a token that is
    not found (a special token, a stripped prefix) maps to None. A token that covers only part of a
    multi-byte character gets the whole character.
    """
    byte_level = _is_byte_level(tokens)
    data = answer.encode("utf-8")
    char_of_byte = []
    for ci, ch in enumerate(answer):
        char_of_byte.extend([ci] * len(ch.encode("utf-8")))
    out: list[tuple[int, int] | None] = []
    pos = 0
    for tok in tokens:
        b = token_bytes(tok, byte_level)
        if not b:
            out.append(None)
            continue
        i = data.find(b, pos, pos + len(b) + 8)
        if i == -1 and b.startswith(b" "):  # SentencePiece adds a space the text does not have
            b = b[1:]
            i = data.find(b, pos, pos + len(b) + 8) if b else -1
        if i == -1:  # the answer may be in another Unicode normal form than the tokens (Devanagari nukta)
            text = b.decode("utf-8", "ignore")
            for form in ("NFC", "NFD"):
                alt = unicodedata.normalize(form, text).encode("utf-8")
                if alt and alt != b:
                    i = data.find(alt, pos, pos + len(alt) + 8)
                    if i != -1:
                        b = alt
                        break
        if i == -1:
            out.append(None)
            continue
        j = i + len(b)
        out.append((char_of_byte[i], char_of_byte[j - 1] + 1))
        pos = j
    return out


class LogitBaseline(dspy.Module):
    """Marks tokens with low logits under the generating model (see the module docstring).

    Args:
        shift: z-score shift before the normal CDF: 0 marks the below-average tokens, a positive shift fewer.
    """

    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.shift = float(shift)

    def forward(self, answer: str = "", model_output_tokens=None, model_output_logits=None, **_):
        answer = answer or ""
        tokens, logits, extra = token_logit_lists(model_output_tokens, model_output_logits)
        if not answer.strip() or not tokens:
            failures = {} if not answer.strip() else {"no_logits": 1}
            return to_prediction(Detection(answer=answer, failures=failures,
                                           rationale="no tokens/logits to score" if failures else "empty answer"))
        offsets = token_offsets(answer, tokens)
        pairs = [(o, lg) for o, lg in zip(offsets, logits)
                 if o is not None and lg is not None and answer[o[0]:o[1]].strip()]
        if not pairs:
            return to_prediction(Detection(answer=answer, failures={"unmapped_tokens": len(tokens), **extra}))
        vals = [lg for _, lg in pairs]
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)) or 1.0
        spans = []
        for (s, e), lg in pairs:
            while s < e and answer[s].isspace():
                s += 1
            p = 0.5 * (1.0 + math.erf(((mean - lg) / sd - self.shift) / math.sqrt(2.0)))
            spans.append(Span(s, e, round(p, 6)))
        score = max(s.prob for s in spans)
        unmapped = sum(o is None for o in offsets) - sum(t in _SPECIAL for t in tokens)
        return to_prediction(Detection(answer=answer, spans=spans, label=score > 0.5, score=score,
                                       rationale="low-logit tokens of the generating model",
                                       failures={**({"unmapped_tokens": unmapped} if unmapped > 0 else {}), **extra}))


def token_logit_lists(tokens, logits) -> tuple[list[str], list[float | None], dict[str, int]]:
    """The generating model's tokens and logits as two lists of one length: ``(tokens, logits, failures)``.

    Each may be a list or a string holding one as JSON or as a Python repr (the official Catalan file). A logit that is not a finite
    number is None (the caller leaves its token out). Lists of different lengths are aligned on their common
    prefix (an end-of-text logit, a dropped last token), counted as ``{"logit_length_mismatch": 1}``; lists that
    differ by more than a tenth of the tokens' length (at least 2) are not the same tokens: both come back empty,
    counted as ``{"logits_length": 1}``. A value given that is neither (a number, a string that holds no list)
    comes back empty, counted as ``{"malformed_logits": 1}``; a missing one just comes back empty.
    """
    tok_list, logit_list = _parse_list(tokens), _parse_list(logits)
    if tok_list is None or logit_list is None:
        return [], [], {"malformed_logits": 1}
    toks = [str(t) for t in tok_list]
    vals = [_as_float(x) for x in logit_list]
    if toks and vals and len(toks) != len(vals):
        if abs(len(toks) - len(vals)) > max(2, len(toks) // 10):
            return [], [], {"logits_length": 1}
        n = min(len(toks), len(vals))
        return toks[:n], vals[:n], {"logit_length_mismatch": 1}
    if len(toks) != len(vals):  # one of them is empty
        return [], [], {}
    return toks, vals, {}


def _parse_list(value) -> list | None:
    """A token or logit list given as a list, or as a string holding one as JSON or as a Python repr (the official
    Catalan file: ``"['El', ' gat']"``; read by :func:`halluscope.core.literals.parse_text_list`, never evaluated);
    ``[]`` when missing (None, blank); None when it is something else."""
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = parse_text_list(value)
        except TextValueError:
            return None
    return list(value) if isinstance(value, (list, tuple)) else None


def _as_float(value) -> float | None:
    """A finite logit, else None (the token is left out)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def build_mark_all() -> MarkAll:
    """:class:`MarkAll` (no options)."""
    return MarkAll()


register_program(ProgramSpec(
    name="mark-all",
    build=build_mark_all,
    description="baseline: the whole answer is hallucinated",
    level="span",
    uses_lm=False,
))

register_program(ProgramSpec(
    name="logits",
    build=LogitBaseline,
    description="baseline: low-logit tokens of the generating model (Mu-SHROOM model_output_logits)",
    level="span",
    uses_lm=False,
    extra_inputs=("model_output_tokens", "model_output_logits"),
    option_types={"shift": number()},  # any finite z-score shift
))
