"""MIPROv2's instruction proposals, robust to a flaky prompt LM (#24).

DSPy's ``GroundedProposer`` asks the prompt LM for one instruction per candidate; one reply that does not parse
(or one HTTP 500 with no retries left) raises out of ``MIPROv2.compile`` and aborts the whole fold. Inside
:func:`robust_proposals`, MIPROv2 uses :class:`RobustGroundedProposer` instead: each proposal is tried
``attempts`` times (each attempt under a new ``rollout_id``, so a cached bad reply is not replayed), and a proposal
that still fails keeps the predictor's current instruction for that candidate and is **counted**
(:class:`ProposalStats`), like a failed item; the caller fails the compile when more than ``--max-failed-share``
of the proposals failed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Iterator

from dspy.propose.grounded_proposer import GroundedProposer
from dspy.teleprompt import mipro_optimizer_v2

from halluscope.core.redact import redact

logger = logging.getLogger(__name__)

__all__ = ["ProposalStats", "RobustGroundedProposer", "robust_proposals"]


@dataclass
class ProposalStats:
    """Instruction proposals asked for, attempts made, proposals that failed every attempt, the last error."""

    proposals: int = 0
    attempts: int = 0
    failed: int = 0
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {"proposals": self.proposals, "proposal_attempts": self.attempts, "proposal_failures": self.failed}


class RobustGroundedProposer(GroundedProposer):
    """``GroundedProposer`` whose per-candidate proposal is retried, then falls back to the current instruction."""

    stats: ProposalStats = ProposalStats()
    attempts: int = 3

    def propose_instruction_for_predictor(self, *args, **kwargs) -> str:
        with self.stats._lock:
            self.stats.proposals += 1
        for _ in range(max(1, self.attempts)):
            with self.stats._lock:
                self.stats.attempts += 1
            try:  # each attempt draws a new rollout_id from the proposer's rng: never the cached reply again
                return super().propose_instruction_for_predictor(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - a bad reply or a failed call: try again, then count it
                error = redact(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
                with self.stats._lock:
                    self.stats.last_error = error
        with self.stats._lock:
            self.stats.failed += 1
        predictor = kwargs.get("predictor") if "predictor" in kwargs else args[1] if len(args) > 1 else None
        current = getattr(getattr(predictor, "signature", None), "instructions", "") or ""
        logger.warning("an instruction proposal failed %d times (%s); that candidate keeps the current instruction",
                       self.attempts, self.stats.last_error)
        return current


@contextlib.contextmanager
def robust_proposals(attempts: int = 3) -> Iterator[ProposalStats]:
    """MIPROv2 compiles inside this block propose through :class:`RobustGroundedProposer`; yields their stats.

    It swaps the name ``GroundedProposer`` in DSPy's MIPROv2 module for the block (DSPy builds its proposer
    there, with no hook to pass one in); compiles are not run concurrently in one process here."""
    stats = ProposalStats()
    proposer = type("BoundRobustGroundedProposer", (RobustGroundedProposer,), {"stats": stats, "attempts": attempts})
    saved = mipro_optimizer_v2.GroundedProposer
    mipro_optimizer_v2.GroundedProposer = proposer
    try:
        yield stats
    finally:
        mipro_optimizer_v2.GroundedProposer = saved
