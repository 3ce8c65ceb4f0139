"""The passage machinery every local retriever shares: multilingual tokens, ≤ N-token chunks, a BM25 index.

* :func:`tokenize` — lowercase (case-folded) word tokens; runs of CJK characters (Han, kana, Hangul) become
  overlapping character **bigrams** (a lone CJK character stays a unigram), because those scripts do not
  separate words with spaces.
* :func:`chunk` — cuts a document into passages of at most ``max_tokens`` tokens, counting a whitespace word
  as one token and each CJK character as one token. Paragraphs are packed together while they fit; a longer
  paragraph is cut at sentence ends when possible, else at token boundaries. Passages are slices of the
  original text (nothing is rewritten).
* :class:`BM25Index` — ``bm25s`` over the passages' tokens; :meth:`BM25Index.save` / :meth:`BM25Index.load`
  use bm25s's own ``.npy`` + JSON files (``allow_pickle=False``) plus ``passages.jsonl`` and ``meta.json``:
  never a pickle.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import bm25s
import numpy as np

from halluscope.core.contract import Evidence
from halluscope.core.fileio import write_text_atomic

__all__ = ["TOKENIZER_VERSION", "Passage", "tokenize", "chunk", "passages_of", "BM25Index", "content_hash"]

TOKENIZER_VERSION = "words-casefold+cjk-bigrams/1"

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(r"\w+", re.UNICODE)
# one chunking token: a CJK character, or a run of non-space, non-CJK characters
_CHUNK_TOKEN = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")
_PARAGRAPH = re.compile(r"\S(?:(?!\n[ \t]*\n)[\s\S])*")  # up to the next blank line
_SENTENCE_END = re.compile(r"[.!?。！？]['\")\]]*$")


def tokenize(text: str) -> list[str]:
    """Search tokens of ``text``: case-folded words, CJK runs as character bigrams."""
    out: list[str] = []
    for m in _WORD.finditer(text or ""):
        word = m.group(0).casefold()
        pos = 0
        for run in _CJK_RUN.finditer(word):
            if run.start() > pos:
                out.append(word[pos:run.start()])
            chars = run.group(0)
            out.extend([chars] if len(chars) == 1 else [chars[i:i + 2] for i in range(len(chars) - 1)])
            pos = run.end()
        if pos < len(word):
            out.append(word[pos:])
    return out


def n_tokens(text: str) -> int:
    """Chunking length of ``text``: whitespace words, each CJK character counted alone."""
    return sum(1 for _ in _CHUNK_TOKEN.finditer(text or ""))


def chunk(text: str, max_tokens: int = 256) -> list[str]:
    """Passages of at most ``max_tokens`` tokens (see the module docstring), in document order."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    text = text or ""
    pieces: list[tuple[int, int, int]] = []  # (start, end, tokens) of pieces no longer than max_tokens
    for para in _PARAGRAPH.finditer(text):
        body = para.group(0).rstrip()
        toks = list(_CHUNK_TOKEN.finditer(body))
        base = para.start()
        if len(toks) <= max_tokens:
            if toks:
                pieces.append((base, base + len(body), len(toks)))
            continue
        i = 0
        while i < len(toks):
            j = min(i + max_tokens, len(toks))
            if j < len(toks):  # prefer to end at a sentence end in the second half of the window
                for c in range(j - 1, i + max_tokens // 2 - 1, -1):
                    if _SENTENCE_END.search(toks[c].group(0)) or toks[c].group(0) in "。！？":
                        j = c + 1
                        break
            pieces.append((base + toks[i].start(), base + toks[j - 1].end(), j - i))
            i = j
    out: list[str] = []
    cur_start = cur_end = None
    cur_n = 0
    for start, end, n in pieces:
        if cur_start is not None and cur_n + n <= max_tokens:
            cur_end, cur_n = end, cur_n + n
            continue
        if cur_start is not None:
            out.append(text[cur_start:cur_end])
        cur_start, cur_end, cur_n = start, end, n
    if cur_start is not None:
        out.append(text[cur_start:cur_end])
    return out


@dataclass(frozen=True)
class Passage:
    """A retrievable passage: ``id`` is ``<doc>#<n>``, ``doc`` the document it was cut from."""

    id: str
    doc: str
    text: str


def passages_of(docs: list[tuple[str, str]], max_tokens: int = 256) -> list[Passage]:
    """``(doc_id, text)`` documents cut into passages (see :func:`chunk`)."""
    return [Passage(f"{doc}#{i}", doc, p) for doc, text in docs for i, p in enumerate(chunk(text, max_tokens))]


def content_hash(docs: list[tuple[str, str]], max_tokens: int) -> str:
    """SHA-256 of the documents (ids and texts, in order), the chunk size and the tokenizer version."""
    h = hashlib.sha256(f"{TOKENIZER_VERSION}|{max_tokens}|".encode())
    for doc, text in docs:
        h.update(hashlib.sha256(doc.encode()).digest())
        h.update(hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


class BM25Index:
    """BM25 (``bm25s``, Lucene variant, k1=1.5, b=0.75) over passages."""

    def __init__(self, passages: list[Passage], bm25: bm25s.BM25 | None = None, meta: dict | None = None):
        self.passages = list(passages)
        self.meta = dict(meta or {})
        if bm25 is None:
            bm25 = bm25s.BM25()
            if self.passages:
                bm25.index([tokenize(p.text) or [""] for p in self.passages], show_progress=False)
        self.bm25 = bm25
        self._vocab = getattr(bm25, "vocab_dict", None) or {}

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (zeros when no query token is in the vocabulary)."""
        if not self.passages:
            return np.zeros(0)
        ids = [self._vocab[t] for t in tokenize(query) if t in self._vocab]
        if not ids:
            return np.zeros(len(self.passages))
        return np.asarray(self.bm25.get_scores(ids), dtype=float)

    def search(self, query: str, k: int = 5) -> list[tuple[Passage, float]]:
        """The ``k`` best passages with a positive score, best first (ties in corpus order)."""
        s = self.scores(query)
        order = sorted((i for i in range(len(s)) if s[i] > 0), key=lambda i: (-s[i], i))[: max(k, 0)]
        return [(self.passages[i], float(s[i])) for i in order]

    def evidence(self, query: str, k: int, source: str) -> list[Evidence]:
        return [Evidence(text=p.text, source=source, id=p.id, score=round(s, 6)) for p, s in self.search(query, k)]

    # -- on disk: bm25s's own npy/json files + passages.jsonl + meta.json; no pickle ---------------------------
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.passages:
            self.bm25.save(str(folder / "bm25"), allow_pickle=False)
        write_text_atomic(folder / "passages.jsonl",
                          "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in self.passages))
        write_text_atomic(folder / "meta.json", json.dumps({**self.meta, "passages": len(self.passages),
                                                            "tokenizer": TOKENIZER_VERSION}, indent=2))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "BM25Index":
        folder = Path(folder)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no knowledge-base index at {folder} (meta.json missing); build one with: "
                                    f"halluscope index build SOURCE --out {folder}")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("tokenizer") != TOKENIZER_VERSION:
            raise ValueError(f"index {folder} was built with tokenizer {meta.get('tokenizer')!r}, this version uses "
                             f"{TOKENIZER_VERSION!r}; rebuild it with: halluscope index build SOURCE --out {folder}")
        passages = []
        with open(folder / "passages.jsonl", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    passages.append(Passage(**json.loads(line)))
        if len(passages) != meta.get("passages"):
            raise ValueError(f"index {folder} is incomplete: meta.json says {meta.get('passages')} passages, "
                             f"passages.jsonl holds {len(passages)}; rebuild it")
        bm25 = bm25s.BM25.load(str(folder / "bm25"), allow_pickle=False) if passages else None
        return cls(passages, bm25, meta)
