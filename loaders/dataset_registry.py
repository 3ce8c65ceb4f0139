"""The dataset registry: every dataset the commands can load, described once.

A :class:`DatasetSpec` says what a dataset is and how the data arguments are read for it: its loader (one
uniform call for all datasets), whether its gold is span- or response-level, its splits, what ``--lang``
and ``--task`` mean for it, whether ``--column`` mappings apply, and the official submission file of its
shared task, if any. The commands (:mod:`halluscope.cli`) read these fields instead of testing names::

    from halluscope.loaders import get_dataset

    spec = get_dataset("halluclean")
    examples, source = spec.load(data_dir=None, task="QA", limit=4)   # task -> "qa"; the demo set stands in
    spec.key(None, "qa")                                              # "qa": compiled/<program>/qa/<metric>/

Which metrics fit a level is the metrics layer's fact (``halluscope.metrics.adapters.METRIC_LEVEL``): a
spec states only what gold its rows carry, and :meth:`DatasetSpec.metric_problem` takes the metric's level.
The registrations (``mushroom``, ``halluclean``, ``generic``) are in :mod:`halluscope.loaders`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from halluscope.core import extensions

__all__ = ["ArgRole", "DatasetArgumentError", "DatasetSpec", "register_dataset", "get_dataset",
           "dataset_names", "level_of"]

LEVELS = ("span", "response", "auto")


class DatasetArgumentError(ValueError):
    """A data argument a dataset refuses or needs (``--lang``, ``--task``, ``--split``, ``--column``, ...).

    The message starts with the argument (``"argument --lang: ..."``); the commands report it as a usage
    error (exit status 2)."""


@dataclass(frozen=True)
class ArgRole:
    """What ``--lang`` or ``--task`` means for a dataset.

    ``meaning`` is ``None`` when the dataset does not use the argument: giving it is an error, never silently
    ignored. ``choices``: the valid values (``None``: any). ``canonical`` maps a value to its canonical form
    (e.g. HalluClean task aliases) and raises ``ValueError`` for an unknown one. ``required``: the dataset
    cannot load without it (a loader may still require it in some cases only, e.g. with a data folder).
    """

    meaning: str | None
    choices: tuple[str, ...] | None = None
    canonical: Callable[[str], str] | None = None
    required: bool = False


#: The role of an argument a dataset does not use.
UNUSED = ArgRole(None)


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset.

    ``loader(data_dir, *, lang, task, split, context, limit, columns) -> (examples, source)``: every loader
    takes the same arguments (``None`` for those it does not use) and returns ``dspy.Example`` s in the common
    schema (inputs ``question, answer, lang, context`` [+ ``task``]; gold ``label`` and, for span data,
    ``hard_labels``/``soft_labels``) and a short description of where they came from (``source``; it starts
    with ``demo`` when a built-in demo set stood in). Call it through :meth:`load`, which checks the arguments.

    ``level``: ``"span"`` (gold spans and a label derived from them), ``"response"`` (a label only) or
    ``"auto"`` (the rows decide: span when they carry span labels, :func:`level_of`). ``splits``: the valid
    ``--split`` values (``None``: whatever the data has), ``default_split`` when none is given.
    ``submission(path, ids, predictions)`` writes the official submission file, when the task has one.
    """

    name: str
    description: str
    loader: Callable[..., tuple[list, str]]
    level: str
    splits: tuple[str, ...] | None = None
    default_split: str | None = None
    lang: ArgRole = UNUSED
    task: ArgRole = UNUSED
    columns: bool = False
    submission: Callable[[Any, Iterable[str], Iterable[Any]], Any] | None = None

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"dataset {self.name!r}: level must be one of {LEVELS}, not {self.level!r}")
        if self.splits is not None and self.default_split not in self.splits:
            raise ValueError(f"dataset {self.name!r}: default split {self.default_split!r} is not in {self.splits}")

    def check_args(self, *, lang: str | None = None, task: str | None = None, split: str | None = None,
                   columns: Mapping[str, str] | None = None) -> tuple[str | None, str | None, str | None]:
        """``(lang, task, split)`` checked and normalised for this dataset (``split`` defaulted).

        Raises :class:`DatasetArgumentError` for an argument the dataset does not use, a missing required
        one, or a value outside its choices; the message names the argument and the valid values."""
        lang = self._check_role("--lang", self.lang, lang)
        task = self._check_role("--task", self.task, task)
        if split is None or split == "":
            split = self.default_split
        elif self.splits is not None and split not in self.splits:
            raise DatasetArgumentError(f"argument --split: invalid choice: {split!r} for --dataset {self.name} "
                                       f"(choose from {', '.join(self.splits)})")
        if columns and not self.columns:
            raise DatasetArgumentError(f"argument --column: --dataset {self.name} has a fixed schema; column "
                                       f"mappings are for --dataset generic")
        return lang, task, split

    def _check_role(self, flag: str, role: ArgRole, value: str | None) -> str | None:
        if value is None or value == "":
            if role.required:
                hint = f"; choose from {', '.join(role.choices)}" if role.choices else ""
                raise DatasetArgumentError(f"argument {flag}: required with --dataset {self.name} "
                                           f"({role.meaning}){hint}")
            return None
        if role.meaning is None:
            raise DatasetArgumentError(f"argument {flag}: --dataset {self.name} does not use {flag} "
                                       f"(got {value!r}); drop it")
        if role.canonical is not None:
            try:
                return role.canonical(value)
            except ValueError as e:
                raise DatasetArgumentError(f"argument {flag}: {e}") from None
        if role.choices is not None and value not in role.choices:
            raise DatasetArgumentError(f"argument {flag}: invalid choice: {value!r} for --dataset {self.name} "
                                       f"({role.meaning}; choose from {', '.join(role.choices)})")
        return value

    def metric_problem(self, metric: str, metric_level: str, examples: Sequence[Any] | None = None) -> str | None:
        """Why ``metric`` (whose level is ``metric_level``, ``"span"``/``"response"``) cannot score this
        dataset, or ``None`` when it can. With ``level="auto"`` the loaded ``examples`` decide (without them a
        span metric is let through)."""
        if metric_level != "span":
            return None  # every dataset has (or derives) a response-level label
        level = self.level if self.level != "auto" or examples is None else level_of(examples)
        if level != "response":
            return None
        why = "its rows carry no span labels (hard_labels/soft_labels)" if self.level == "auto" \
            else "it has no span labels"
        return f"{metric!r} scores spans, but --dataset {self.name} is response-level: {why}; choose a " \
               f"response-level metric"

    def load(self, data_dir=None, *, lang: str | None = None, task: str | None = None, split: str | None = None,
             context: str | None = None, limit: int | None = None,
             columns: Mapping[str, str] | None = None) -> tuple[list, str]:
        """``(examples, source)``: the arguments checked (:meth:`check_args`), then the loader called."""
        if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
            raise DatasetArgumentError(f"argument --limit: must be at least 1, not {limit!r}")
        lang, task, split = self.check_args(lang=lang, task=task, split=split, columns=columns)
        return self.loader(data_dir, lang=lang, task=task, split=split, context=context, limit=limit,
                           columns=dict(columns or {}))

    def key(self, lang: str | None, task: str | None, examples: Sequence[Any] = ()) -> str:
        """The key artifacts compiled on this data are stored under (``compiled/<program>/<key>/<metric>/``):
        the task, else the language (given, else the first example's), else ``"all"``."""
        first = examples[0].get("lang") if len(examples) else None
        return task or lang or first or "all"


def level_of(examples: Iterable[Any]) -> str:
    """``"span"`` when any example carries ``hard_labels`` or ``soft_labels``, else ``"response"``."""
    for ex in examples:
        if ex.get("hard_labels") is not None or ex.get("soft_labels") is not None:
            return "span"
    return "response"


_REGISTRY: dict[str, DatasetSpec] = extensions.table("datasets")  # the datasets of the one extension registry


def register_dataset(spec: DatasetSpec, *, replace: bool = False) -> DatasetSpec:
    """Add ``spec`` under ``spec.name``; registering a taken name raises ``ValueError`` unless ``replace``."""
    if not isinstance(spec, DatasetSpec):
        raise TypeError(f"register_dataset takes a DatasetSpec, not {type(spec).__name__}")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"dataset {spec.name!r} is already registered")
    return extensions.register("datasets", spec.name, spec)


def get_dataset(name: str) -> DatasetSpec:
    """The dataset registered as ``name`` (a built-in, or a plugin's through its ``halluscope.datasets`` entry
    point); ``KeyError`` naming the registered ones otherwise."""
    spec = extensions.get("datasets", name)
    if not isinstance(spec, DatasetSpec):
        raise TypeError(f"dataset {name!r} is registered as a {type(spec).__name__}, not a DatasetSpec")
    return spec


def dataset_names() -> list[str]:
    """The registered dataset names, in registration order."""
    return extensions.names("datasets")


def dataset_specs() -> list[DatasetSpec]:
    """Every registered dataset's spec, in registration order (what ``--help`` describes)."""
    table = extensions.table("datasets")
    return [table[name] for name in dataset_names()]
