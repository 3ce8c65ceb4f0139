"""``grounded``: an evidence-grounded span detector for small or no LMs (issue #9).

Every unit of the answer (word, number, CJK character: :mod:`.units`) gets features from signals that need
no capable LM — support in the retrieved evidence and the question (:mod:`.support`), the generating model's
own token logits (:mod:`.genlogits`), and optionally the embedded LM as a scorer of the answer with vs.
without the evidence (:mod:`.lmscore`) — and a logistic regression fuses them (:mod:`.combiner`) into a
probability per unit. The fitted weights, threshold, floor, normalisation constants and IDF table are the
program's compiled state (plain JSON through ``dump_state``/``load_state``); ``fit_grounded`` is its
``ProgramSpec.fit`` hook, so ``python optimize.py --program grounded`` fits it instead of prompting.
"""

from __future__ import annotations

from halluscope.programs.grounded.detector import DEFAULT_WEIGHTS, GroundedDetector, fit_grounded
from halluscope.programs.registry import ProgramSpec, register

__all__ = ["GroundedDetector", "fit_grounded", "DEFAULT_WEIGHTS"]

register(ProgramSpec(
    name="grounded",
    build=GroundedDetector,
    description="every word/number scored from evidence support, IDF, the generating model's logits "
                "(and optionally the embedded LM as a scorer), fused by a fitted logistic regression",
    level="span",
    uses_lm=False,
    extra_inputs=("model_output_tokens", "model_output_logits"),
    fit=fit_grounded,
    lm_when=lambda options: bool(str(options.get("detectors") or "").strip()),
))
