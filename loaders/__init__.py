"""Data loaders and the dataset registry.

Datasets (:mod:`.dataset_registry`), each registered in the module that defines it (importing this package
registers them): ``mushroom`` (Mu-SHROOM span data, :mod:`.mushroom`, with the built-in demo set of :mod:`.demo`
when no data is configured), ``halluclean`` (the five HalluClean tasks, :mod:`.halluclean`, with
its demo cases) and ``generic`` (any local JSON/JSONL/CSV/Parquet file or Hub dataset through HuggingFace
``datasets``, with a column mapping: :mod:`.generic`). The commands load through the registry::

    from halluscope.loaders import get_dataset

    spec = get_dataset("mushroom")
    examples, source = spec.load("../shared/data/mushroom", lang="de", context="native", limit=8)
"""

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
from halluscope.loaders.halluclean import load_halluclean  # noqa: F401  (registers the halluclean dataset)
from halluscope.loaders.generic import load_generic  # registers the generic dataset
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
