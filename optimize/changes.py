"""What a compile changed in a program: a pure comparison of two saved program states.

An optimizer's output is only as trustworthy as the evidence for it. On a small model MIPROv2's final compile can
pick a proposed instruction such as "This is the new instruction. The story of the Shiver of the Shadows." because it
scored 5 of 10 against the default's 3 of 10 on its validation split (#21 round eight), while cross-validation shows
no gain. :func:`state_changes` lists what the compile changed (instructions, field wording, demos, fitted decision
parameters) so that the run's summary, its report and the artifact's manifest show it beside the cross-validated
scores, and :func:`unsupported_changes` says when those scores do not back it.

Both states are what ``dspy.Module.dump_state()`` returns (``program.json`` of an artifact): one entry per named
predictor, with ``signature.instructions``, ``signature.fields`` (prefix, description), ``demos`` and the
decision outputs' fitted ``fields`` (e.g. ``{"verdict": {"threshold": 0.5}}``).
"""

from __future__ import annotations

__all__ = ["state_changes", "format_changes", "unsupported_changes"]

SHOWN_CHARS = 160  # an instruction is shown up to this many characters in the summary


def _is_predictor(value) -> bool:
    return isinstance(value, dict) and "signature" in value


def _predictors(state: dict) -> dict[str, dict]:
    return {k: v for k, v in (state or {}).items() if _is_predictor(v)}


def _other_state(state: dict) -> dict:
    """The state that is not a predictor's (e.g. ``grounded``'s fitted combiner), without DSPy's metadata."""
    return {k: v for k, v in (state or {}).items() if k != "metadata" and not _is_predictor(v)}


def state_changes(before: dict, after: dict) -> list[dict]:
    """What differs between two program states, one dict per change, in predictor order:

    ``{"predictor", "what": "instructions" | "field" | "demos" | "fitted" | "predictor" | "state", "before",
    "after"}`` (``field`` gives the field's position; ``fitted`` names the decision field; ``state`` is any other
    part of the state, e.g. a fitted combiner, named by its key, with its values left out). Identical states
    give ``[]``."""
    old, new = _predictors(before), _predictors(after)
    changes: list[dict] = []
    for name in list(old) + [n for n in new if n not in old]:
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            changes.append({"predictor": name, "what": "predictor", "before": a is not None, "after": b is not None})
            continue
        sa, sb = a.get("signature") or {}, b.get("signature") or {}
        if sa.get("instructions") != sb.get("instructions"):
            changes.append({"predictor": name, "what": "instructions", "before": sa.get("instructions"),
                            "after": sb.get("instructions")})
        fa, fb = sa.get("fields") or [], sb.get("fields") or []
        for i in range(max(len(fa), len(fb))):
            x, y = (fa[i] if i < len(fa) else None), (fb[i] if i < len(fb) else None)
            if x != y:
                changes.append({"predictor": name, "what": "field", "field": i, "before": x, "after": y})
        da, db = a.get("demos") or [], b.get("demos") or []
        if da != db:
            changes.append({"predictor": name, "what": "demos", "before": len(da), "after": len(db)})
        pa, pb = a.get("fields") or {}, b.get("fields") or {}
        for key in list(pa) + [k for k in pb if k not in pa]:
            if pa.get(key) != pb.get(key):
                changes.append({"predictor": name, "what": "fitted", "field": key, "before": pa.get(key),
                                "after": pb.get(key)})
    oa, ob = _other_state(before), _other_state(after)
    for key in list(oa) + [k for k in ob if k not in oa]:
        if oa.get(key) != ob.get(key):
            changes.append({"predictor": key, "what": "state", "before": None, "after": None})
    return changes


def _short(text) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= SHOWN_CHARS else s[:SHOWN_CHARS - 1] + "…"


def format_changes(changes: list[dict]) -> list[str]:
    """One readable line per change (for the run's summary)."""
    lines = []
    for c in changes:
        p, what = c["predictor"], c["what"]
        if what == "instructions":
            lines.append(f"{p}: instructions {_short(c['before'])!r} -> {_short(c['after'])!r}")
        elif what == "field":
            lines.append(f"{p}: field {c['field']} {c['before']} -> {c['after']}")
        elif what == "demos":
            same = " (other demos)" if c["before"] == c["after"] else ""
            lines.append(f"{p}: {c['before']} -> {c['after']} demos{same}")
        elif what == "fitted":
            lines.append(f"{p}: fitted {c['field']} {c['before']} -> {c['after']}")
        elif what == "state":
            lines.append(f"{p}: fitted state (see program.json)")
        else:
            lines.append(f"{p}: predictor {'added' if c['after'] else 'removed'}")
    return lines


def unsupported_changes(changes: list[dict], compiled: float | None, zero_shot: float | None) -> bool:
    """Whether the compile changed the program although cross-validation shows no gain: the compiled mean is not
    above the zero-shot mean (both of the run's metric; None: no cross-validation, nothing to say)."""
    return bool(changes) and compiled is not None and zero_shot is not None and compiled <= zero_shot
