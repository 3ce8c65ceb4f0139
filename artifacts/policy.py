"""The run policy: which program, artifact and version serve a language or a task. One function for every caller.

``halluscope detect``, ``halluscope serve``, the Ray engine and Python users all call :func:`load_detector` (or
:func:`choose`, which decides without loading), so the answer to "what checks German answers here?" is the same
everywhere::

    from halluscope import load_detector
    detector = load_detector(lang="de")          # grounded, the best German version, verified
    print(detector.why)                          # one line: what was chosen and why
    detection = detector("Die spanische Provinz heißt Álava.", context="...")

The rules, in order:

* an explicit ``program`` is kept; without one, the **embedded model** (no LM configured, or a local GGUF) is
  served ``grounded``, which needs no capable LM, and any other LM the LM span detector ``spans``;
* the artifact is the best version for the language or task (:func:`halluscope.artifacts.store.rank_versions`,
  over the user's ``<home>/compiled`` and the artifacts bundled with the package);
* no artifact for the key: the program's cross-lingual artifact (``all``, compiled with ``--lang all``) if it has
  one, for a language (``grounded``'s also for a HalluClean task); a program with no artifact at all is served
  **unfitted** (its zero-shot module, ``detector.fitted`` is False) and ``why`` says so, or refused in one line when
  it cannot run untrained (``encoder``). There is no dead end, and the embedded model is never handed an LM program
  it cannot run unless asked for by name;
* ``lang="auto"`` (or neither ``lang`` nor ``task``): an :class:`AutoDetector`, which identifies each answer's
  language offline (:func:`halluscope.core.langid.identify`, on the question with the answer) and serves it the
  detector the rules above give that language (``all`` when the identifier is unsure), loading each at most once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from halluscope.artifacts.compiled import CompiledDetector
from halluscope.artifacts.store import ArtifactNotFoundError, list_versions, load_compiled
from halluscope.core import paths
from halluscope.core.tasks import canonical_task
from halluscope.programs.registry import get_program

__all__ = ["Choice", "Detector", "AutoDetector", "choose", "load_detector", "is_embedded", "CROSS_LINGUAL", "AUTO"]

#: the key of an artifact fitted on every validation language (``--lang all``), served for a language without its own
CROSS_LINGUAL = "all"
#: the language key that means "identify each answer's language"
AUTO = "auto"


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided: the program, the artifact key (a language, a task or ``all``), the metric,
    the pinned version (None: the best), whether an artifact exists (``fitted``) and ``why`` (one line, empty when
    exactly what was asked is served). ``refused``: no artifact, and the program cannot run untrained
    (``ProgramSpec.needs_fit``): ``why`` then says how to train one, and :func:`load_detector` raises it."""

    program: str
    key: str
    metric: str
    version: int | str | None = None
    fitted: bool = True
    why: str = ""
    refused: bool = False


def is_embedded(lm: object = None) -> bool:
    """Whether ``lm`` (a spec string, a ``dspy.LM``, or None for DSPy's configured one) is the embedded model or
    another in-process GGUF: ``local``, ``local:PATH``, or a configured LM whose model is ``llamacpp/...``; no LM
    configured counts as embedded (halluscope configures it when a program needs it)."""
    if lm is None:
        import dspy  # noqa: PLC0415 - DSPy's settings are read only when no LM was named

        lm = dspy.settings.lm
        if lm is None:
            return True
    model = lm if isinstance(lm, str) else str(getattr(lm, "model", "") or "")
    return model.startswith(("local", "llamacpp/"))


def _has(program: str, key: str, metric: str, root) -> bool:
    return bool(list_versions(program, key, metric, root=root))


def choose(lang: str | None = None, task: str | None = None, *, program: str | None = None,
           metric: str | None = None, version: int | str | None = None, lm: object = None,
           root: str | os.PathLike | None = None) -> Choice:
    """Decide what serves ``lang`` or ``task`` (see the module's rules); nothing is loaded. ``lm``: the LM that will
    run it (a spec such as ``"local"`` or ``"openai/gpt-4o-mini"``, a ``dspy.LM``, or None for the configured one)."""
    task = canonical_task(task) if task else None
    key = task or lang
    if not key:
        raise ValueError("give a language (lang=) or a HalluClean task (task=): artifacts are stored per language "
                         "or task")
    explicit = program is not None
    if program is not None:
        get_program(program)  # KeyError naming the registered programs
    embedded = is_embedded(lm)
    name = program or ("grounded" if embedded else "spans")
    metric = metric or ("f1" if task and name == "grounded" else get_program(name).default_metric)
    default = "" if explicit else (" (the default with the embedded model; spans is the LM span detector)"
                                   if name == "grounded" else " (the default with a capable LM)")
    if version is not None or _has(name, key, metric, root):
        why = "" if explicit else f"program {name}{default}, artifact for {key!r}"
        return Choice(name, key, metric, version, True, why)
    if key != CROSS_LINGUAL and (not task or name == "grounded"):
        span_metric = metric if not task else "iou"
        if _has(name, CROSS_LINGUAL, span_metric, root):
            return Choice(name, CROSS_LINGUAL, span_metric, None, True,
                          f"program {name}{default}: no artifact for {key!r}, using the cross-lingual one "
                          f"({name}/{CROSS_LINGUAL}/{span_metric}, fitted on every language of its data)")
    train = f"{paths.optimize_command()} --program {name} {'--task' if task else '--lang'} {key} --metric {metric}"
    if get_program(name).needs_fit:
        return Choice(name, key, metric, None, False,
                      f"program {name}: no trained artifact for {key!r}/{metric}, and it cannot run untrained: train "
                      f"one with {train}", refused=True)
    return Choice(name, key, metric, None, False,
                  f"program {name}{default}: no compiled artifact for {key!r}/{metric}, serving the unfitted program "
                  f"(compile one: {train})")


@dataclass(frozen=True)
class Detector(CompiledDetector):
    """A :class:`CompiledDetector` with the policy's decision: ``choice`` and ``why``; ``fitted`` is False for an
    unfitted program served because no artifact exists (then ``path`` is None and ``version`` 0)."""

    choice: Choice = Choice("", "", "")

    @property
    def why(self) -> str:
        return self.choice.why

    @property
    def fitted(self) -> bool:
        return self.choice.fitted


def load_detector(lang: str | None = None, task: str | None = None, *, program: str | None = None,
                  metric: str | None = None, version: int | str | None = None, lm: object = None,
                  root: str | os.PathLike | None = None, trust_endpoints: bool = False,
                  options: dict | None = None) -> Detector | AutoDetector:
    """The detector that serves ``lang`` or ``task``: :func:`choose`, then the chosen version loaded and verified
    (:func:`halluscope.artifacts.store.load_compiled`), or the unfitted program when there is no artifact.
    ``detector.why`` says what was chosen; configure an LM first only when the program needs one.
    ``lang="auto"``, or no ``lang`` and no ``task``: an :class:`AutoDetector` choosing per answer (``version`` is
    refused there: a version number belongs to one language's artifacts)."""
    if not task and (not lang or str(lang).lower() == AUTO):
        if version is not None:
            raise ValueError("version= needs a language (lang=) or a task (task=): each language numbers its own "
                             "versions")
        return AutoDetector(program=program, metric=metric, lm=lm, root=root, trust_endpoints=trust_endpoints,
                            options=dict(options or {}))
    choice = choose(lang, task, program=program, metric=metric, version=version, lm=lm, root=root)
    if choice.fitted:
        loaded = load_compiled(choice.program, lang=choice.key, metric=choice.metric, version=choice.version,
                               root=root, trust_endpoints=trust_endpoints, options=options)
        return Detector(program=loaded.program, manifest=loaded.manifest, path=loaded.path, choice=choice)
    spec = get_program(choice.program)
    try:  # built first, so that a refused program also says what to install when it cannot be built here
        module = spec.make(**(options or {}))
    except (TypeError, ValueError) as e:
        raise ArtifactNotFoundError(f"{choice.why}; and the program cannot be built: {e}") from None
    if choice.refused:
        raise ArtifactNotFoundError(choice.why)
    manifest = {"program": choice.program, "lang": choice.key, "metric": choice.metric, "version": 0,
                "program_options": dict(options or {}), "content_hash": "", "unfitted": True}
    return Detector(program=module, manifest=manifest, path=None, choice=choice)


@dataclass
class AutoDetector:
    """What :func:`load_detector` gives for ``lang="auto"``: calling it identifies the answer's language (with
    the question, which often says more than a short answer) and runs the detector :func:`load_detector` gives
    that language; an unsure identification (a name, a number, "Yes.") gets the cross-lingual ``all`` artifact.
    The detection is run with the identified language, so a language served by ``all`` is still told what it is.
    ``detector_for(answer, question=...)`` returns the chosen :class:`Detector` (its ``why`` names the language)
    without running it; ``last_why`` is the ``why`` of the latest call. Loaded detectors are kept, one per key."""

    program: str | None = None
    metric: str | None = None
    lm: object = None
    root: str | os.PathLike | None = None
    trust_endpoints: bool = False
    options: dict = field(default_factory=dict)
    last_why: str = ""
    _loaded: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def why(self) -> str:
        return ("per answer: its language identified offline (langid), then the run policy for that language"
                + (f"; last: {self.last_why}" if self.last_why else ""))

    @property
    def fitted(self) -> bool:
        return all(d.fitted for d in self._loaded.values()) if self._loaded else True

    def identify(self, answer: str, question: str = "") -> tuple[str | None, float]:
        """The language code of ``question`` + ``answer`` (None when unsure) and the identifier's confidence."""
        from halluscope.core.langid import identify  # noqa: PLC0415 - langid decodes its model on first use

        return identify(f"{question or ''}\n{answer or ''}")

    def for_lang(self, lang: str) -> Detector:
        """The detector serving ``lang`` (loaded once): what a row that names its language gets."""
        with self._lock:
            det = self._loaded.get(lang)
            if det is None:
                det = load_detector(lang=lang, program=self.program, metric=self.metric, lm=self.lm,
                                    root=self.root, trust_endpoints=self.trust_endpoints,
                                    options=self.options or None)
                self._loaded[lang] = det
        return det

    def detector_for(self, answer: str, question: str = "") -> tuple[Detector, str | None]:
        """The detector serving this answer and the identified language (None when unsure)."""
        code, conf = self.identify(answer, question)
        det = self.for_lang(code or CROSS_LINGUAL)
        said = f"language {code!r} (confidence {conf:.2f})" if code else "language unsure"
        self.last_why = f"{said}: {det.why or f'{det.name} for {det.lang!r}'}"
        return det, code

    def __call__(self, answer: str, **kwargs):
        lang = kwargs.get("lang")
        if lang and str(lang).lower() != AUTO:  # the caller (or a JSONL row) named the language
            det = self.for_lang(str(lang))
            self.last_why = f"language {lang!r} as given: {det.why or f'{det.name} for {det.lang!r}'}"
            return det(answer, **kwargs)
        det, code = self.detector_for(answer, kwargs.get("question", "") or "")
        kwargs["lang"] = code or None
        return det(answer, **kwargs)
