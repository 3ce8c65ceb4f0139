"""``grounded``: an evidence-grounded span detector for small or no LMs (issue #9).

Every unit of the answer (word, number, CJK character: :mod:`.units`) gets features from signals that need
no capable LM, one module each in :mod:`.signals` — support in the retrieved evidence and the question
(:mod:`.signals.support`), the generating model's own token logits (:mod:`.signals.genlogits`), and optionally
the embedded LM as a scorer of the answer with vs. without the evidence (:mod:`.signals.lmscore`) — and a
logistic regression fuses them (:mod:`.combiner`) into a
probability per unit. The fitted weights, threshold, floor, normalisation constants and IDF table are the
program's compiled state (plain JSON through ``dump_state``/``load_state``); ``fit_grounded`` is its
``ProgramSpec.fit`` hook, so ``python optimize.py --program grounded`` fits it instead of prompting.
"""

from __future__ import annotations

from pathlib import Path

from halluscope.core import paths
from halluscope.programs.grounded.program import DEFAULT_WEIGHTS, GroundedDetector, build_grounded, fit_grounded
from halluscope.programs.registry import ProgramSpec, free, number, register_program, text, whole

__all__ = ["GroundedDetector", "build_grounded", "fit_grounded", "DEFAULT_WEIGHTS"]


def _lm_model_problem(lm_model, options) -> str | None:
    """With the LM signal on, a named GGUF file must exist (else every item would fail as ``lm_missing``)."""
    if (options.get("lm") or options.get("resp_lm")) and lm_model and not Path(lm_model).expanduser().is_file():
        return f"no GGUF file {lm_model!r} (the LM signal is on: -O lm=true or resp_lm=true); give an existing .gguf file, or \"\" " \
               f"for the embedded SmolLM2-135M-Instruct"
    return None


def _encoder_artifact_problem(path, options) -> str | None:
    """A named encoder artifact must be a folder (a trained one is checked when the signal loads it)."""
    if not path:
        return None
    from halluscope.programs.encoder.program import encoder_artifact_dir  # noqa: PLC0415 — torch is not imported

    where = encoder_artifact_dir(path)
    if not (where / "manifest.json").is_file():
        return f"no encoder artifact folder (with a manifest.json) at {path!r} ({where}); give a version of the " \
               f"store such as all/iou/v0001 (under the compiled folder's encoder/) or a folder path, trained with " \
               f"{paths.optimize_command()} --program encoder"
    return None


def _extras(options) -> tuple[str, ...]:
    """``encoder_prob`` needs the ``encoder`` extra (the artifact store then serves another version without it)."""
    return ("encoder",) if str(options.get("encoder_prob")).lower() in ("true", "1") else ()


def _rules_problem(rules, options) -> str | None:
    if rules not in (True, False, "all", "numbers", "true", "false"):
        return f"rules takes true, false, \"all\" or \"numbers\", not {rules!r}"
    return None


register_program(ProgramSpec(
    name="grounded",
    build=build_grounded,
    description="every word/number scored from evidence support, IDF, the generating model's logits "
                "(and optionally the embedded LM as a scorer), fused by a fitted logistic regression",
    level="span",
    uses_lm=False,
    extra_inputs=("model_output_tokens", "model_output_logits"),
    fit=fit_grounded,
    lm_when=lambda options: bool(str(options.get("detectors") or "").strip()),
    extras_when=_extras,
    load_options=("evidence_free",),
    option_types={"lm_model": text(what="a GGUF file path, or \"\" for the embedded model", check=_lm_model_problem),
                  "lm_evidence_tokens": whole(0), "lm_item_tokens": whole(0), "window": whole(0),
                  "l2": number(0, lo_open=True), "head_l2": number(0, lo_open=True), "aggregate": text("max", "top3"),
                  "combiner": text("logreg", "trees"), "head": text("logreg", "trees"),
                  "hidden_model": text(what="a GGUF file path, \"gemma\" (the optional gemma extra) or \"\" for the "
                                            "embedded SmolLM2-135M-Instruct"),
                  "hidden_item_tokens": whole(0), "hidden_evidence_tokens": whole(0),
                  "hidden_alpha": number(0, lo_open=True), "hidden_parts": text("all", "probe", "tokens"),
                  "unit_pool_weight": number(0, lo_open=True),
                  "head_features": text("all", "content"), "head_frame_weight": number(0, lo_open=True),
                  "decide_words": text("any", "claims"), "decide_p": number(0.5, 1, hi_open=True),
                  "head_metric": text("", "f1", "balanced_accuracy", "accuracy"),
                  "encoder_artifact": text(what="a trained encoder artifact (<key>/iou/vNNNN in the store, or a folder), or \"\"",
                                           check=_encoder_artifact_problem),
                  "encoder_oof": text(what="a file of out-of-fold encoder probabilities the fit reads (JSON lines of "
                                           "scripts/bench_encoder.py --save-probs), or \"\"; a loaded artifact "
                                           "never reads it"),
                  "rules": free("true, false, \"all\" (= true) or \"numbers\"", check=_rules_problem)},
))
