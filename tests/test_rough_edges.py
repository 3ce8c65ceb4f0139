"""Rough edges a user meets (issue #35, items 14 and 15): register twice, the missing-key hint, optimize's output,
Ray progress, serve's start-up line, and the plots of ``halluscope compare``."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from halluscope.optimize.run import run_optimize
from tests.test_optimize_stages import PROGRAM, _config, _examples, fit_program  # noqa: F401  (fixture)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_register_twice_makes_one_version_and_prints_one_line_each(tmp_path, store, fit_program, capfd):  # noqa: F811
    from halluscope import cli

    run_optimize(_config(tmp_path), _examples(8))
    argv = ["register", "--program", PROGRAM, "--lang", "de", "--metric", "f1",
            "--compiled-dir", str(tmp_path / "compiled"), "--tracking-uri", store]
    outs = []
    for _ in range(2):
        assert cli.main(argv) == 0
        out, err = capfd.readouterr()
        outs.append(out + err)
    first, second = ([ln for ln in o.splitlines() if "registered" in ln] for o in outs)
    assert len(first) == 1 and first[0].startswith("registered ") and "version 1 @champion" in first[0], outs[0]
    assert len(second) == 1 and second[0].startswith("already registered: ") and "version 1 @" in second[0], outs[1]
    client = MlflowClient(store, registry_uri=store)
    versions = client.search_model_versions(f"name='halluscope-{PROGRAM}-de'")
    assert [str(v.version) for v in versions] == ["1"]
    assert len(client.search_runs([r.experiment_id for r in client.search_experiments()],
                                  "tags.`halluscope.kind` = 'register'")) == 1


# -- the missing-key hint -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    'or pass api_key="..." to dspy.LM(...).',
    "Pass the key explicitly (api_key= on dspy.LM), or on a host with an environment set OPENAI_API_KEY=...",
    "Configure credentials for openai-chat",
])
def test_redaction_keeps_placeholders_and_prose_in_hints(text):
    from halluscope.core.redact import redact

    assert redact(text) == text


@pytest.mark.parametrize("text,hidden", [
    ("api_key=abcd1234efgh", "abcd1234efgh"), ('{"token": "tok-12345678"}', "tok-12345678"),
    ("OPENAI_API_KEY=sk-live-0123456789", "sk-live-0123456789"), ("password=hunter22", "hunter22"),
    ("authorization: Bearer-xyz987", "Bearer-xyz987"),
])
def test_redaction_still_hides_assigned_values(text, hidden):
    from halluscope.core.redact import redact

    assert hidden not in redact(text) and "***" in redact(text)


def test_the_missing_key_hint_is_one_whole_line(monkeypatch, capsys, tmp_path):
    from halluscope import cli

    monkeypatch.chdir(tmp_path)
    for k in ("OPENAI_API_KEY", "HALLUSCOPE_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "--program", "spans", "--lm", "openai/gpt-4o-mini", "--limit", "1", "--no-mlflow"])
    assert e.value.code == 1
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "LM check failed" in ln]
    assert 'pass api_key="..." to dspy.LM' in line and "(api_key= on dspy.LM)" in line, line
    assert line.rstrip().endswith("Configure credentials for openai-chat"), line
    assert "***" not in line


# -- optimize's output ------------------------------------------------------------------------------------------


def test_optimize_shows_its_own_lines_not_dspys_bars_prints_and_info_log(tmp_path, monkeypatch, capfd):
    from halluscope.cli import main as cli_main
    from halluscope.serve.openai_compat import SchemaBackend, create_openai_app
    from tests.test_openai_client_path import first_word_of_answer, running

    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path))
    monkeypatch.delenv("HALLUSCOPE_CACHE_DIR", raising=False)
    monkeypatch.delenv("HALLUSCOPE_COMPILED_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    noise = ("Processed ", "INFO dspy", "Bootstrapping set", "it/s]", "Average Metric", "PROPOSED INSTRUCTION",
             "class ExtractSpans", "WARNING dspy")
    with running(create_openai_app(SchemaBackend(first_word_of_answer))) as base:
        argv = ["optimize", "--program", "spans", "--lang", "en", "--limit", "8", "--folds", "2",
                "--lm", "openai/stand-in", "--api-base", base, "--no-mlflow"]
        assert cli_main(argv) == 0
        out, err = capfd.readouterr()
        assert "-- fold 1/2" in err and "fold 2: zero-shot iou=" in err and "artifact:" in out
        assert not [ln for ln in (out + err).splitlines() if any(n in ln for n in noise)], err
        assert len(err.splitlines()) < 20, err
        assert cli_main([*argv, "--dspy-log"]) == 0  # DSPy's own output on demand
        out, err = capfd.readouterr()
        assert "INFO dspy" in err and "Bootstrapping set" in err and len(err.splitlines()) > 50


# -- serve's start-up line ------------------------------------------------------------------------------------------


def test_serve_says_it_is_serving_when_it_answers_and_counts_the_whole_start_up(tmp_path):
    import os
    import re
    import subprocess
    import sys
    import time

    import httpx

    from tests.test_serve import _free_port, write

    write(tmp_path, "mark-all", "de")
    port = _free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "serve", "--program", "mark-all", "--lang", "de",
                             "--compiled-dir", str(tmp_path), "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "HALLUSCOPE_HOME": str(tmp_path / "home")})
    try:
        lines = []
        for line in proc.stderr:  # up to the line that says the server is up
            lines.append(line)
            if "serving on" in line:
                break
        seen = time.perf_counter() - t0
        assert lines and "serving on" in lines[-1], "".join(lines)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/detect", json={"answer": "Eins zwei.", "lang": "de"}, timeout=10)
        assert r.status_code == 200  # answered at once: the line is printed once the server listens
        m = re.search(r"(?:ready|started) in ([0-9.]+) s", lines[-1])
        assert m, lines[-1]
        # the time printed is the start-up a user waits for (imports included), not the last step of it
        assert float(m.group(1)) >= 0.5 * seen, (lines[-1], seen)
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


# -- compare's plots ------------------------------------------------------------------------------------------------


def _plot_rows():
    from tests.test_compare_views import _row

    rows = [
        _row("spans", "de", 0.0, 20, n=240, tokens=5000),  # a zero score
        _row("mark-all", "de", 0.41, 0, n=3, tokens=0),  # three items
        _row("spans", "de", 0.9, 500, kind="optimize", sd=0.3, optimizer="MIPROv2(auto=light)", zero_shot=0.2, n=40),
        {**_row("grounded", "de", 0.35, 0, n=240, tokens=0), "content_hash": "cd1f6999abcdef", "artifact_version": 3,
         "optimizer": "fit (the program's own fit hook: logistic weights over its features)"},
        {**_row("mark-all", "en", 0.97, 0, n=26, tokens=0), "source": "demo/en/val"},  # demo data
        _row("logits", "en", 0.3, 0, n=2, tokens=0),
    ]
    for i, r in enumerate(rows):
        r["run_id"] = f"{r['run_id']}-{i}"
    return rows


@pytest.fixture
def figures(monkeypatch):
    """The matplotlib figures the plot functions save, kept for inspection."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved, original = [], Figure.savefig

    def keep(self, *a, **k):
        saved.append(self)
        return original(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_bar_plot_labels_n_keeps_error_bars_in_range_and_shows_zero(tmp_path, figures):
    from matplotlib.collections import LineCollection

    from halluscope.tracking.runs import plot_scores

    assert plot_scores(_plot_rows(), "iou", tmp_path / "bars.png").stat().st_size > 5000
    (fig,) = figures
    ax = fig.axes[0]
    texts = _texts(fig)
    assert any("n=3!" in t for t in texts) and any("n=2!" in t for t in texts) and any("n=240" in t for t in texts)
    tops = [y for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments() for _, y in seg]
    assert tops and max(tops) <= 1.0 + 1e-9  # 0.9 ± 0.3 ends at 1.0
    assert any("0.000" in t for t in texts)
    zero_marks = [ln for ln in ax.lines if list(ln.get_ydata()) == [0, 0] and ln.get_linewidth() >= 2]
    assert zero_marks, "a score of 0 has no visible mark"
    demo_bars = [p for p in ax.patches if p.get_hatch()]
    assert len(demo_bars) == 1 and abs(demo_bars[0].get_height() - 0.97) < 1e-9


def test_grid_keeps_demo_data_off_the_colour_scale_and_labels_n(tmp_path, figures):
    import numpy as np

    from halluscope.tracking.views import plot_grid

    plot_grid(_plot_rows(), "iou", tmp_path / "grid.png")
    (fig,) = figures
    ax = fig.axes[0]
    (image,) = ax.images
    values = np.ma.masked_invalid(image.get_array())
    assert image.get_clim() == (0.0, 1.0)
    assert abs(values.max() - 0.9) < 1e-9  # the brightest cell is real data; the demo's 0.97 is not on the scale
    assert [p for p in ax.patches if p.get_hatch()]  # the demo cell: grey, hatched
    texts = _texts(fig)
    assert any("DEMO" in t and "0.970" in t for t in texts)
    assert any("n=3!" in t for t in texts) and any("-0.300/+0.100" in t for t in texts)  # clipped at 1.0


def test_frontier_labels_are_whole_and_points_carry_n(tmp_path, figures):
    from halluscope.tracking.views import plot_frontier, run_setting

    rows = _plot_rows()
    assert run_setting(rows[3]) == "fit; v0003; #cd1f6999"  # the optimizer's name, not its cut description
    long_options = {**rows[3], "options": {f"option_{i}": i for i in range(12)}, "program": "x"}
    cut = run_setting(long_options)
    assert " …" in cut and "option_1" in cut and not cut.split(" …")[0].endswith(("option_", "="))  # between two
    plot_frontier(rows, "iou", tmp_path / "frontier.png", cost="tokens")
    (fig,) = figures
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert "grounded [fit; v0003; #cd1f6999] (m)" in legend and not any("…" in t for t in legend)
    texts = _texts(fig)
    assert any(t == "n=3!" for t in texts) and any(t == "n=240" for t in texts)
    for ax in fig.axes:
        assert ax.get_ylim()[0] < 0  # a score of 0 is above the axis line
