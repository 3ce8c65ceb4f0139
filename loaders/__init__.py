"""Data loaders: Mu-SHROOM (``loaders.mushroom``) and the built-in demo set (``loaders.demo``).

Typical use::

    from halluscope.loaders import resolve_data_dir, demo_data_dir, load_mushroom, DEMO_NOTICE

    root = resolve_data_dir(args.data_dir)      # --data-dir, else $HALLUSCOPE_DATA_DIR, else None
    if root is None:
        print(DEMO_NOTICE)
        root = demo_data_dir()
    examples = load_mushroom(root, lang="de", context="native")
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
]
