"""The ``encoder_prob`` signal: the trained ``encoder`` program's word probability as a unit feature (cost encoder).

``enc_p``: for each unit of the answer, the highest raw probability (before the encoder's threshold) of the
encoder's words that overlap it (0 where none does), from :func:`halluscope.programs.encoder.program.encoder_word_probs`.

Off by default as an option; served where the ``encoder`` extra is installed: BENCHMARKS.md ("`grounded` with
the encoder's word probability") measured it on the 10 languages, 5-fold CV with the default encoder's out-of-fold
probabilities: +0.041 to +0.049 IoU and +0.057 to +0.066 Corr, and the served ``grounded`` versions of the
languages where it pays use it (the artifact store serves them only with the extra; without it, the versions
without the signal, so the default install, which has no torch, is unchanged). Turn it on with ``-O
encoder_prob=true -O encoder_artifact=REF`` (``REF``: a trained encoder's version in the store, ``<key>/iou/vNNNN``
under the compiled folder's ``encoder/``, else the package's bundled store, where the served encoder
``all/iou/v0001`` ships; or a version folder's path; read by
:func:`~halluscope.programs.encoder.program.load_encoder_dir`). Where the probabilities come from is the
signal's ``provider``, a function ``(question, answer, context, lang) -> [(start, end, p), ...]``: built from
``artifact`` on the first item (its answers remembered per item for the process), or set by the caller (a
benchmark gives out-of-fold probabilities this way). ``oof`` (``-O encoder_oof=FILE``) is read when the program is
fitted: every item the file holds then takes its out-of-fold probabilities, so the combiner is fitted and
cross-validated on probabilities of encoders that did not train on the item.
Missing at run time (the ``encoder`` extra not installed, no ``artifact`` given, an artifact that does not load,
a provider that fails): one warning line, ``enc_p`` imputed with the combiner's training mean, the note
``encoder_prob_missing``."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

from halluscope.programs.grounded.signals.base import Item, Signal, register_signal
from halluscope.programs.registry import text

__all__ = ["EncoderProbSignal", "ENCODER_PROB", "read_oof", "oof_table", "unit_max"]

logger = logging.getLogger(__name__)

ENCODER_PROB = ("enc_p",)
_WARNED: set[str] = set()  # encoder artifacts whose overlap with a fit was warned about (once per process)


def unit_max(units, word_probs) -> list[float]:
    """For each unit (``.start``, ``.end``), the highest ``p`` of the ``(start, end, p)`` words overlapping it
    (0.0 where none does)."""
    out = []
    for u in units:
        ps = [float(p) for a, b, p in word_probs if a < u.end and u.start < b]
        out.append(max(ps) if ps else 0.0)
    return out


def read_oof(path) -> dict[str, dict]:
    """The rows of an out-of-fold file (``scripts/bench_encoder.py --save-probs``: JSON lines ``{"id", "lang",
    "fold", "answer", "probs": [[start, end, p], ...]}``; ``fold`` is the fold's number, or the held-out language
    in ``scripts/bench_encoder_loo.py --save-probs``) by item id. ``ValueError`` (one line) naming the file
    and line when it cannot be read, a row is malformed or an id repeats."""
    rows: dict[str, dict] = {}
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the out-of-fold file {str(path)!r} ({type(e).__name__}: {e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ok = isinstance(r, dict) and isinstance(r.get("id"), str) and isinstance(r.get("fold"), (int, str)) and \
                isinstance(r.get("answer", ""), str) and isinstance(r.get("lang", ""), str) and \
                all(len(t) == 3 and all(isinstance(x, (int, float)) for x in t) for t in r["probs"])
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            raise ValueError(f"{path}: line {n}: not an out-of-fold row (id, fold, probs [[start, end, p], ...])")
        if r["id"] in rows:
            raise ValueError(f"{path}: line {n}: id {r['id']!r} repeats")
        rows[r["id"]] = r
    return rows


def oof_table(rows: dict[str, dict]) -> dict[tuple[str, str], list[tuple[int, int, float]]]:
    """``(lang, answer) -> [(start, end, p), ...]`` of out-of-fold rows (:func:`read_oof`; rows without an
    ``answer`` are left out). Two rows with the same language and answer (asked differently) get the mean of their
    probabilities word by word, so a lookup by answer is defined."""
    groups: dict[tuple[str, str], list[list]] = {}
    for r in rows.values():
        if "answer" in r:
            groups.setdefault((r.get("lang", ""), r["answer"]), []).append(r["probs"])
    table = {}
    for key, group in groups.items():
        first = group[0]
        same = all(len(g) == len(first) and all(tuple(a[:2]) == tuple(b[:2]) for a, b in zip(g, first)) for g in group)
        if not same:  # cannot happen for one answer and one tokenizer; keep the first rather than guess
            group = [first]
        table[key] = [(int(a), int(b), sum(float(g[i][2]) for g in group) / len(group))
                      for i, (a, b, _p) in enumerate(first)]
    return table


#: the trained encoders loaded in this process, by folder (:func:`shared_encoder`)
_ENCODERS: dict[str, object] = {}
_LOAD_LOCK = threading.Lock()


def artifact_key(ref) -> str:
    """What identifies a trained encoder in this process: its folder and its weights' SHA-256 (from its manifest),
    so two stores that both hold ``all/iou/v0001`` never share answers."""
    from halluscope.programs.encoder.program import encoder_artifact_dir

    where = encoder_artifact_dir(ref)
    try:
        sha = (json.loads((where / "manifest.json").read_text(encoding="utf-8")).get("files") or {})
    except (OSError, ValueError, AttributeError):
        sha = {}
    return f"{where.resolve()}#{sorted(sha.values()) if isinstance(sha, dict) else ''}"


def shared_encoder(ref):
    """The trained encoder ``ref`` names (:func:`~halluscope.programs.encoder.program.load_encoder_dir`), loaded
    once per process and folder: every served language's ``grounded`` reads the same encoder, and a server that
    loads eight of them holds one copy (about 700 MB), not eight. Loading is serialised (threads of a server)."""
    from halluscope.programs.encoder.program import load_encoder_dir

    key = artifact_key(ref)
    with _LOAD_LOCK:
        if key not in _ENCODERS:
            _ENCODERS[key] = load_encoder_dir(ref)
        return _ENCODERS[key]


#: the encoder's word probabilities already computed in this process, by artifact and item (:func:`memoized`)
_MEMO: dict[tuple[str, str], list] = {}
MEMO_ITEMS = 20_000


def memoized(artifact: str, provider):
    """``provider`` remembering its answers per ``artifact`` and item for the life of the process (up to
    :data:`MEMO_ITEMS`, then cleared): cross-validation builds a program per fold, and every fold's fit reads the
    same training items (a response head's thousands of HalluClean answers) through the same encoder."""
    def remembered(question, answer, context, lang):
        key = (str(artifact), hashlib.sha256(json.dumps([question, answer, context, lang]).encode()).hexdigest())
        hit = _MEMO.get(key)
        if hit is None:
            if len(_MEMO) >= MEMO_ITEMS:
                _MEMO.clear()
            hit = _MEMO[key] = [tuple(t) for t in provider(question, answer, context, lang)]
        return list(hit)
    return remembered


@register_signal
class EncoderProbSignal(Signal):
    name, columns, cost, order = "encoder_prob", ENCODER_PROB, "encoder", 45
    option_types = {"artifact": text(what="a trained encoder artifact: a version of the store (<key>/iou/vNNNN, "
                                          "under the compiled folder's encoder/) or a version folder, or \"\" "
                                          "(none: the column is imputed)"),
                    "oof": text(what="a file of out-of-fold encoder probabilities read when fitting (JSON lines "
                                     "from scripts/bench_encoder.py --save-probs), or \"\"")}
    missing = frozenset({"encoder_prob_missing"})
    notes = frozenset({"encoder_prob_missing"})

    @classmethod
    def defaults(cls) -> dict:
        return {"artifact": "", "oof": ""}

    def __init__(self, **options):
        super().__init__(**options)
        #: ``(question, answer, context, lang) -> [(start, end, p), ...]``; None: built from ``artifact``
        self.provider = None
        self._broken: str | None = None  # why no provider could be built (warned once)
        #: the fingerprints of the answers the artifact's encoder trained on (None: unknown, or a set provider)
        self.trained_on: frozenset[str] | None = None
        #: ``(lang, answer) -> word probabilities`` read from ``oof`` by :meth:`fit_start` (never by a loaded
        #: artifact): the items it holds take these instead of the encoder's
        self.oof: dict[tuple[str, str], list] | None = None

    def _provider(self):
        if self.provider is None and self._broken is None:
            path = self.options["artifact"]
            try:
                if not path:
                    raise ValueError("no trained encoder artifact given (-O encoder_artifact=PATH)")
                from halluscope.programs.encoder.program import encoder_word_probs, require_extra
                require_extra()
                det = shared_encoder(path)
                self.provider = memoized(artifact_key(path),
                                         lambda q, a, c, lang: encoder_word_probs(q, a, c, lang, det))
                self.trained_on = frozenset(det.trained_on) if det.trained_on else None
            except Exception as e:  # noqa: BLE001 — the extra missing, a bad artifact: the defined fallback
                self._broken = f"{type(e).__name__}: {e}"
                logger.warning("grounded: the encoder_prob signal has no encoder (%s); enc_p is imputed",
                               self._broken)
        return self.provider

    def run(self, item: Item) -> None:
        st = item.state["encoder_prob"] = {"probs": None, "failed": False}
        if not item.answer.strip():
            return
        if self.oof is not None and (item.lang or "", item.answer) in self.oof:
            st["probs"] = list(self.oof[(item.lang or "", item.answer)])
            st["oof"] = True
            return
        provider = self._provider()
        if provider is None:
            st["failed"] = True
            return
        try:
            st["probs"] = [(int(a), int(b), float(p)) for a, b, p in
                           provider(item.question or "", item.answer, item.raw_context or item.context or "",
                                    item.lang or "")]
        except Exception as e:  # noqa: BLE001 — one item's failure is the fallback, never an exception
            logger.warning("grounded: the encoder_prob provider failed (%s: %s); enc_p is imputed",
                           type(e).__name__, e)
            st["failed"] = True

    def compute(self, item: Item) -> dict[str, list[float]]:
        probs = (item.state.get("encoder_prob") or {}).get("probs")
        if probs is None:
            return {"enc_p": [0.0] * len(item.units)}
        item.used.append("encoder_prob")
        return {"enc_p": unit_max(item.units, probs)}

    def fit_start(self) -> dict:
        """With ``oof`` set: read the out-of-fold file (``ValueError``, one line, when it cannot be) so that every
        item it holds, training and held-out, gets the probabilities of the encoder that did not train on it."""
        path = self.options["oof"]
        if not path:
            return {}
        if self.oof is None:
            self.oof = oof_table(read_oof(path))
            self._oof_sha = hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
        return {"oof": str(path), "oof_sha256": self._oof_sha, "oof_answers": len(self.oof)}

    def fit_check(self, answers: list[str]) -> dict:
        """How many of ``grounded``'s training answers the artifact's encoder trained on (by fingerprint), with one
        warning per encoder and process when any did: on those its probabilities are in-sample, more confident
        and more often right than on new answers, so the combiner learns to trust ``enc_p`` more than it should.
        ``{}`` when unknown (a provider set by the caller, or an encoder artifact that stores no fingerprints)."""
        covered = {a for _lang, a in self.oof} if self.oof is not None else set()
        from_oof = {"from_oof": sum(a in covered for a in answers)} if self.oof is not None else {}
        if self.trained_on is None:
            return {"answers": len(answers), **from_oof} if from_oof else {}
        from halluscope.programs.encoder.program import answer_fingerprint

        seen = sum(answer_fingerprint(a) in self.trained_on and a not in covered for a in answers)
        if seen and self.options["artifact"] not in _WARNED:
            _WARNED.add(self.options["artifact"])
            logger.warning("grounded: %d of %d training answers are answers the encoder (%s) trained on: its enc_p "
                           "on them is in-sample, and the combiner learns to trust it more than it should; fit the "
                           "combiner on other items than the encoder's, or give its out-of-fold probabilities (-O encoder_oof=FILE; "
                           "docs/guides/encoder.md)", seen, len(answers),
                           self.options["artifact"])
        return {"answers": len(answers), "in_encoder_training": seen, **from_oof}

    def late_failures(self, item: Item) -> dict[str, int]:
        return {"encoder_prob_missing": int(bool((item.state.get("encoder_prob") or {}).get("failed")))}
