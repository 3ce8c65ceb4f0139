"""The comparison views of ``halluscope compare``: a programs × languages (or tasks) grid of scores with their
cross-validation spread, and a cost–quality frontier.

Rows come from :func:`halluscope.tracking.runs.runs_table` (newest first; the latest run of each
series and language counts). A *series* is a program and how it was made: ``spans evaluate (LM)``,
``spans MIPROv2 [iou] (LM)`` (the cross-validated compiled mean), ``spans zero-shot, CV (LM)``.

The frontier plots, per language, the metric of the latest evaluate run of each program, setting and LM
against its cost per item — LM calls (``lm_calls / n``) or tokens (``(input + output tokens) / n``). The
setting (:func:`run_setting`) is how the program was made, whichever the run carries: the program options that
differ from its defaults, the optimizer setting, the artifact version and hash (:func:`add_run_settings`
reads them from the runs' parameters), so runs that differ there are separate points. The Pareto front is
marked: the runs no other run beats on both (higher score at no higher cost). Optimize runs are left out of the frontier: their
logged LM usage is the cost of compiling, not of running the program. Both views are PNGs; :func:`log_views`
records them (and the rows) as an MLflow run of the experiment ``halluscope-compare``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

from halluscope.tracking.runs import (FEW_ITEMS, error_bar, get_experiment_id, is_demo, metric_range, n_text,
                                      open_client, wrap_label)

__all__ = ["COMPARE_EXPERIMENT", "SETTING_PARAMS", "add_run_settings", "run_setting", "grid_cells",
           "frontier_points", "pareto_front", "plot_grid", "plot_frontier", "log_views"]

COMPARE_EXPERIMENT = "halluscope-compare"  # not halluscope/...: compare's own runs are not compared


# run parameters that say how an evaluated program was made, copied into its row by add_run_settings
SETTING_PARAMS = ("options", "optimizer", "optimizer_desc", "artifact_version", "content_hash")
_MAX_SETTING_CHARS = 90  # longer: cut at a "; " or "," and a hash of the whole added (labels wrap, not cut)
_MAX_OPTIMIZER_CHARS = 24  # a longer optimizer description in prose ("fit (the program's own ...)"): its name


def add_run_settings(rows: Sequence[dict], tracking_uri: str | None = None) -> list[dict]:
    """``rows`` with the :data:`SETTING_PARAMS` each finished evaluate run logged (program options, optimizer
    setting, artifact version/hash) added, read from MLflow: :func:`run_setting` uses them to keep runs of
    one program and LM with different settings apart. A run that cannot be read keeps its row as is."""
    client, _ = open_client(tracking_uri)
    out = []
    for r in rows:
        r = dict(r)
        if r.get("kind") == "evaluate" and r.get("status") == "FINISHED" and r.get("run_id"):
            try:
                params = client.get_run(r["run_id"]).data.params
            except Exception:  # noqa: BLE001 - a vanished run: compared without its setting
                params = {}
            for key in SETTING_PARAMS:
                if key in params and r.get(key) in (None, "-", "?", ""):
                    r[key] = params[key]
        out.append(r)
    return out


def _changed_options(program: str, options) -> dict:
    """The options of a run that differ from the program's defaults (all of them for an unknown program)."""
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            return {"options": options}
    if not isinstance(options, dict):
        return {}
    try:
        from halluscope.programs.registry import get_program

        defaults = get_program(program).options
    except Exception:  # noqa: BLE001 - a program this installation does not have
        defaults = {}
    return {k: v for k, v in sorted(options.items()) if k not in defaults or defaults[k] != v}


def run_setting(r: dict) -> str:
    """How the run's program was made, short (``""`` when it carries nothing beyond the defaults):
    ``reasoning=true``, ``MIPROv2(auto=light)``, ``v0003 #1a2b3c4d``, joined by ``; ``."""
    parts = []
    changed = _changed_options(str(r.get("program", "")), r.get("options"))
    if changed:
        parts.append(",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in changed.items()))
    opt = r.get("optimizer_desc") or r.get("optimizer")
    if opt not in (None, "", "-", "?"):
        opt = str(opt)
        if len(opt) > _MAX_OPTIMIZER_CHARS and " (" in opt:  # "fit (prose ...)": its name; the prose is in the run
            opt = opt.split(" (", 1)[0].strip() or opt
        parts.append(opt)
    version = r.get("artifact_version")
    if version not in (None, "", "-"):
        parts.append(f"v{int(version):04d}" if str(version).isdigit() else str(version))
    if r.get("content_hash"):
        parts.append(f"#{str(r['content_hash'])[:8]}")
    text = "; ".join(parts)
    if len(text) > _MAX_SETTING_CHARS:  # long option lists: cut between two of them, with a hash of the whole
        head = text[: _MAX_SETTING_CHARS - 10]
        cut = max(head.rfind("; "), head.rfind(","))
        text = (head[:cut] if cut > 0 else head) + " …" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return text


def _series(r: dict) -> list[tuple[str, float | None, float | None]]:
    """``[(label, score, sd)]`` a row contributes to the grid (an optimize run gives compiled and zero-shot)."""
    demo = " DEMO" if str(r.get("source", "")).startswith("demo") else ""
    if r["kind"] == "optimize":
        opt = str(r["optimizer"]).split("(", 1)[0].strip()
        opt = opt if opt not in ("", "?", "-") else "unknown optimizer"
        return [(f"{r['program']} {opt} [{r['opt_metric']}] ({r['lm']}){demo}", r["score"], r["sd"]),
                (f"{r['program']} zero-shot, CV ({r['lm']}){demo}", r["zero_shot"], r.get("zero_shot_sd"))]
    return [(f"{r['program']} ({r['lm']}){demo}", r["score"], None)]


def grid_cells(rows: Sequence[dict], *, meta: bool = False) -> dict[tuple[str, str], tuple]:
    """``{(series, lang): (score, sd or None)}`` from the latest finished run of each series and language;
    ``meta=True``: ``(score, sd, n items, demo data?)``."""
    cells: dict[tuple[str, str], tuple] = {}
    for r in rows:
        if r["status"] != "FINISHED":
            continue
        for label, score, sd in _series(r):
            if score is not None:
                cell = (float(score), sd) + ((r.get("n"), is_demo(r)) if meta else ())
                cells.setdefault((label, r["lang"]), cell)
    return cells


def frontier_points(rows: Sequence[dict], cost: str = "calls") -> dict[str, list[dict]]:
    """``{lang: [{"label", "setting", "cost", "score", "run_id"}]}``: the latest finished evaluate run of each
    program, setting (:func:`run_setting`: options, optimizer setting, artifact version) and LM per language,
    with its cost per item (``cost`` "calls" or "tokens"). Runs that differ in their setting are separate
    points, labelled ``program [setting] (LM)``."""
    if cost not in ("calls", "tokens"):
        raise ValueError(f"cost must be 'calls' or 'tokens', not {cost!r}")
    out: dict[str, list[dict]] = {}
    seen = set()
    for r in rows:
        if r["status"] != "FINISHED" or r["kind"] != "evaluate" or r["score"] is None or not r.get("n"):
            continue
        setting = run_setting(r)
        demo = " DEMO" if str(r.get("source", "")).startswith("demo") else ""
        label = f"{r['program']}{f' [{setting}]' if setting else ''} ({r['lm']}){demo}"
        if (label, r["lang"]) in seen:
            continue
        used = r.get("lm_calls") if cost == "calls" else r.get("lm_tokens")
        if used is None:
            continue
        seen.add((label, r["lang"]))
        out.setdefault(r["lang"], []).append({"label": label, "setting": setting,
                                              "cost": float(used) / float(r["n"]),
                                              "score": float(r["score"]), "run_id": r["run_id"],
                                              "n": r["n"], "demo": is_demo(r)})
    return out


def pareto_front(points: Sequence[dict]) -> list[dict]:
    """The points no other point dominates (score at least as high at no higher cost, and better in one),
    sorted by cost."""
    front = []
    for p in points:
        dominated = any(q["cost"] <= p["cost"] and q["score"] >= p["score"]
                        and (q["cost"] < p["cost"] or q["score"] > p["score"]) for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: (p["cost"], -p["score"]))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_grid(rows: Sequence[dict], metric: str, path: str | os.PathLike) -> Path | None:
    """A heat-map grid, series × language, each cell the score (± the sd over CV folds where there is one, clipped
    to the metric's range) and its number of items (``n=3!`` below :data:`FEW_ITEMS`). The colour scale is
    the metric's whole range and real data only: demo-data cells are grey and hatched, never the brightest."""
    cells = grid_cells(rows, meta=True)
    if not cells:
        return None
    plt = _plt()
    langs = sorted({lang for _, lang in cells})
    series = sorted({label for label, _ in cells})
    import numpy as np
    from matplotlib.patches import Rectangle

    lo, hi = metric_range(metric)
    values = np.full((len(series), len(langs)), np.nan)
    for (label, lang), (v, _, _, demo) in cells.items():
        if not demo:
            values[series.index(label), langs.index(lang)] = v
    labels = [wrap_label(s, 50) for s in series]
    longest = max(len(line) for t in labels for line in t.split("\n"))
    fig, ax = plt.subplots(figsize=(1.5 + 1.1 * len(langs) + 0.06 * longest, 1.2 + 0.62 * len(series)))
    im = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto", vmin=lo, vmax=hi)
    for (label, lang), (v, sd, n, demo) in cells.items():
        i, j = series.index(label), langs.index(lang)
        below, above = error_bar(v, sd, metric)
        spread = "" if sd is None else (f"\n±{sd:.3f}" if below == above else f"\n-{below:.3f}/+{above:.3f}")
        text = f"{v:.3f}{spread}\n{n_text(n)}" + ("\nDEMO" if demo else "")
        if demo:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.85", hatch="//", edgecolor="0.6",
                                   linewidth=0))
        dark = not demo and v < (lo + hi) / 2
        color = "white" if dark else "black"
        if n_text(n).endswith("!") and not dark:
            color = "firebrick"
        ax.text(j, i, text, ha="center", va="center", fontsize=6.5, color=color)
    ax.set_xticks(range(len(langs)), labels=langs)
    ax.set_yticks(range(len(series)), labels=labels, fontsize=7)
    ax.set_title(f"{metric}: latest run per program and language (± sd over CV folds; n: items, ! under "
                 f"{FEW_ITEMS}; demo data grey, off the scale)", fontsize=8)
    fig.colorbar(im, ax=ax, label=metric)
    return _save(fig, path)


def plot_frontier(rows: Sequence[dict], metric: str, path: str | os.PathLike, cost: str = "calls") -> Path | None:
    """Metric vs cost per item, one panel per language, the Pareto front joined and its points circled."""
    points = frontier_points(rows, cost)
    if not points:
        return None
    plt = _plt()
    langs = sorted(points)
    fig, axes = plt.subplots(1, len(langs), figsize=(4.2 * len(langs), 4.0), squeeze=False)
    labels = sorted({p["label"] for pts in points.values() for p in pts})
    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    lo, hi = metric_range(metric)
    for ax, lang in zip(axes[0], langs):
        pts = points[lang]
        for p in pts:
            demo = p.get("demo")
            ax.scatter(p["cost"], p["score"], s=40, zorder=3, color="none" if demo else colors[p["label"]],
                       edgecolors=colors[p["label"]], hatch="////" if demo else None, clip_on=False)
            few = n_text(p.get("n")).endswith("!")
            ax.annotate(n_text(p.get("n")), (p["cost"], p["score"]), textcoords="offset points", xytext=(5, 4),
                        fontsize=6, color="firebrick" if few else "0.3")
        front = pareto_front(pts)
        ax.plot([p["cost"] for p in front], [p["score"] for p in front], "--", color="grey", zorder=2,
                drawstyle="steps-post", label="Pareto front")
        ax.scatter([p["cost"] for p in front], [p["score"] for p in front], s=160, facecolors="none",
                   edgecolors="black", zorder=4)
        ax.set_title(lang)
        ax.set_xlabel("LM calls per item" if cost == "calls" else "LM tokens per item (in + out)")
        ax.set_ylabel(metric)
        ax.set_ylim(lo - 0.03 * (hi - lo), hi + 0.05 * (hi - lo))  # a score of 0 sits above the axis, visible
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=colors[label], label=wrap_label(label, 70))
               for label in labels]
    handles.append(plt.Line2D([], [], marker="o", linestyle="--", color="grey", markerfacecolor="none",
                              markeredgecolor="black", markersize=10, label="Pareto front"))
    fig.legend(handles=handles, loc="lower center", ncol=min(3, len(handles)), fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, -0.02 - 0.04 * (len(handles) // 3)))
    fig.suptitle(f"cost–quality frontier: {metric} vs {'LM calls' if cost == 'calls' else 'tokens'} per item "
                 f"(latest evaluate run per program and setting)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(handles) // 3), 1, 1))
    return _save(fig, path)


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _plt().close(fig)
    return path


def log_views(files: Sequence[str | os.PathLike], rows: Sequence[dict], metric: str,
              tracking_uri: str | None = None) -> str:
    """Record the PNGs and the rows (JSON) as one run of the experiment ``halluscope-compare``; its id."""
    client, uri = open_client(tracking_uri)
    exp_id = get_experiment_id(client, COMPARE_EXPERIMENT, uri)
    run = client.create_run(exp_id, run_name=f"compare-{metric}-{time.strftime('%Y%m%d-%H%M%S')}",
                            tags={"halluscope.kind": "compare", "halluscope.metric": metric})
    try:
        client.log_param(run.info.run_id, "metric", metric)
        client.log_metric(run.info.run_id, "runs", float(len(rows)))
        for f in files:
            client.log_artifact(run.info.run_id, str(f), artifact_path="compare")
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "runs.json"
            table.write_text(json.dumps(list(rows), indent=2, default=str), encoding="utf-8")
            client.log_artifact(run.info.run_id, str(table), artifact_path="compare")
    except Exception:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id
