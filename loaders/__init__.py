"""Data loaders and the dataset registry.

Datasets (:mod:`.dataset_registry`): ``mushroom`` (Mu-SHROOM span data, :mod:`.mushroom`, with the built-in demo set of
:mod:`.demo` when no data is configured), ``halluclean`` (the five HalluClean tasks, :mod:`.halluclean`, with
its demo cases) and ``generic`` (any local JSON/JSONL/CSV/Parquet file or Hub dataset through HuggingFace
``datasets``, with a column mapping: :mod:`.generic`). The commands load through the registry::

    from halluscope.loaders import get_dataset

    spec = get_dataset("mushroom")
    examples, source = spec.load("../shared/data/mushroom", lang="de", context="native", limit=8)
"""

import logging
from pathlib import Path

from halluscope.loaders.demo import (
    DEMO_ITEMS,
    DEMO_LANGS,
    DEMO_NOTICE,
    DEMO_VERSION,
    DemoItem,
    demo_data_dir,
    demo_records,
    write_demo_data,
)
from halluscope.loaders.mushroom import (
    CONTEXT_VARIANTS,
    ENV_VAR,
    INPUT_FIELDS,
    LANGS,
    SPLITS,
    VAL_LANGS,
    MushroomDataWarning,
    candidate_files,
    last_load_stats,
    load_gold_records,
    load_mushroom,
    resolve_data_dir,
    write_submission,
)
from halluscope.loaders.halluclean import halluclean_demo, load_halluclean, resolve_halluclean_dir
from halluscope.loaders.generic import load_generic, load_generic_dataset
from halluscope.loaders.dataset_registry import (
    ArgRole,
    DatasetArgumentError,
    DatasetSpec,
    dataset_names,
    dataset_specs,
    get_dataset,
    level_of,
    register_dataset,
)
from halluscope.core.tasks import HALLUCLEAN_TASKS, canonical_task

logger = logging.getLogger(__name__)

__all__ = [
    "LANGS",
    "VAL_LANGS",
    "SPLITS",
    "CONTEXT_VARIANTS",
    "ENV_VAR",
    "INPUT_FIELDS",
    "MushroomDataWarning",
    "resolve_data_dir",
    "candidate_files",
    "load_mushroom",
    "load_gold_records",
    "last_load_stats",
    "write_submission",
    "DemoItem",
    "DEMO_ITEMS",
    "DEMO_LANGS",
    "DEMO_NOTICE",
    "DEMO_VERSION",
    "demo_records",
    "write_demo_data",
    "demo_data_dir",
    "ArgRole",
    "DatasetArgumentError",
    "DatasetSpec",
    "register_dataset",
    "get_dataset",
    "dataset_names",
    "dataset_specs",
    "level_of",
    "load_generic",
]


# -- the built-in datasets: one uniform loader each --------------------------------------------------------

def _load_mushroom_dataset(data_dir=None, *, lang=None, task=None, split="val", context="none", limit=None,
                           columns=None):
    root = resolve_data_dir(data_dir)
    if root is None:  # no data configured: the demo set stands in, in English unless a language is named
        logger.warning(DEMO_NOTICE)
        root, lang, source = demo_data_dir(), lang or "en", "demo"
    else:
        if lang is None and Path(root).is_dir():
            raise DatasetArgumentError(f"argument --lang: required with a Mu-SHROOM data folder ({root}); "
                                       f"choose from {', '.join(LANGS)}")
        source = "mushroom"
    # "all": every language with a file in the folder (one cross-lingual artifact, keyed "all")
    examples = load_mushroom(root, lang=None if lang == "all" else lang, split=split, context=context or "none",
                             limit=limit)
    return examples, f"{source}/{lang or 'all'}/{split}/context={context or 'none'}"


def _load_halluclean_dataset(data_dir=None, *, lang=None, task=None, split="dev", context=None, limit=None,
                             columns=None):
    root = resolve_halluclean_dir(data_dir)
    if root is None:  # no data configured: the demo cases stand in (halluclean_demo logs the notice)
        return halluclean_demo(task, limit), f"halluclean-demo/{task}"
    return load_halluclean(root, task, limit=limit, split=split), f"halluclean/{task}"


def _write_mushroom_submission(path, ids, predictions):
    """The official Mu-SHROOM submission file; a failed prediction (``None``) is submitted as no spans."""
    return write_submission(path, list(ids), [p if p is not None else {"hard_labels": [], "soft_labels": []}
                                              for p in predictions])


register_dataset(DatasetSpec(
    name="mushroom",
    description="Mu-SHROOM (SemEval-2025 Task 3): span-level gold in 14 languages; the built-in demo set "
                "stands in when no data is configured (--data-dir or $HALLUSCOPE_DATA_DIR)",
    loader=_load_mushroom_dataset, level="span", splits=SPLITS, default_split="val",
    lang=ArgRole("the Mu-SHROOM language, or all (every language in the folder); required with a data folder, "
                 "en for the demo set", choices=(*LANGS, "all")),
    submission=_write_mushroom_submission,
))
register_dataset(DatasetSpec(
    name="halluclean",
    description="the five HalluClean evaluation sets: response-level labels; built-in demo cases stand in "
                "when no data is configured (--data-dir or $HALLUSCOPE_HALLUCLEAN_DIR)",
    loader=_load_halluclean_dataset, level="response", splits=("dev",), default_split="dev",
    task=ArgRole("the HalluClean task", choices=HALLUCLEAN_TASKS, canonical=canonical_task, required=True),
))
register_dataset(DatasetSpec(
    name="generic",
    description="any local .json/.jsonl/.csv/.tsv/.parquet file (or folder, or HuggingFace Hub name) given as "
                "--data-dir, its columns mapped onto the common schema with --column FIELD=COLUMN",
    loader=load_generic_dataset, level="auto",
    lang=ArgRole("keep the rows of this language (with a lang column), else set it on every row"),
    task=ArgRole("keep the rows of this task (with a task column), else set it on every row"),
    columns=True,
))
