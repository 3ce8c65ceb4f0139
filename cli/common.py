"""Arguments every command shares (LM, data, program options) and what they resolve to."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import NoReturn

from halluscope.cli.log import setup_logging  # noqa: F401 — re-exported: commands import it from here
from halluscope.core import paths
from halluscope.core.paths import set_offline_defaults

set_offline_defaults()  # before anything imports litellm (through dspy) or MLflow

from halluscope.lm.llamacpp import ModelFileError  # noqa: E402
from halluscope.lm.models import CacheFolderError, LMCheckError, UnsafeFolderError, check_lm, configure  # noqa: E402
from halluscope.loaders import DatasetArgumentError, DatasetSpec, dataset_specs, get_dataset
from halluscope.loaders.generic import FIELDS, parse_column_mapping
from halluscope.loaders.mushroom import CONTEXT_VARIANTS
from halluscope.programs.registry import OptionError, number, ranged, whole



def parse_options(pairs: list[str] | None, spec=None) -> dict:
    """``["reasoning=true", "shift=0.5", "samplers=[\\"local\\"]"]`` -> typed dict (JSON values, else strings).

    With a registry ``spec`` (:class:`halluscope.programs.registry.ProgramSpec`): the program's default options
    overlaid with these, checked by ``spec.check_options`` (unknown names, non-finite numbers). Every problem
    raises ``argparse.ArgumentTypeError`` (for ``parser.error``: exit status 2), naming the valid options.
    """
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            hint = f"; valid options: {', '.join(sorted(spec.options)) or '(none)'}" if spec is not None else ""
            raise argparse.ArgumentTypeError(f"program option {pair!r} is not KEY=VALUE{hint}")
        k, v = pair.split("=", 1)
        if not k.strip():
            raise argparse.ArgumentTypeError(f"program option {pair!r} has no name before '='")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    if spec is None:
        return out
    try:
        return spec.check_options(out)
    except OptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: The command-line numbers every command shares, with their ranges. Every number has one (a bound left out is
#: ``programs.registry.MAX_WHOLE``/``MAX_NUMBER``): ``--lm-retries 10^30`` is "argument --lm-retries: expected
#: a whole number in [0, 100], got ...", exit 2.
POSITIVE_INT = ranged(whole(1))  # [1, 1000000]
COUNT = ranged(whole(0))  # [0, 1000000]
SECONDS = ranged(number(0, 7 * 86400, lo_open=True))  # (0 s, a week]
SHARE = ranged(number(0, 1))
PORT = ranged(whole(0, 65535))
THREADS = ranged(whole(1, 1024))  # parallel calls, workers
RETRIES = ranged(whole(0, 100))
SEED = ranged(whole(0, 2**32 - 1))  # what numpy and Python's random take alike
ITEMS = ranged(whole(1, 10**9))  # --limit
TOKENS = ranged(whole(1, 10**7))  # a generation or context budget
BYTES = ranged(whole(1, 2**40))  # a size limit (1 TiB)


def add_max_failed_share(p, default: float, what: str) -> None:
    """``--max-failed-share``: the command fails (exit 1, the reason in one line) when more than this share of
    its items failed: raised, or returned no usable output (:func:`halluscope.core.contract.item_failure`)."""
    p.add_argument("--max-failed-share", type=SHARE, default=default,
                   help=f"{what} FAILS (exit 1, the reason in one line) when more than this share of the items failed "
                        f"(raised, or an LM output that could not be read, was cut or failed) (default {default:g})")


def failed_share_line(n_failed: int, total: int, max_share: float, why: str, what: str = "items") -> str | None:
    """``RUN FAILED: 3 of 4 items failed (unusable output: parse x3; more than --max-failed-share 0.5)``, or None
    when at most ``max_share`` of ``total`` failed."""
    if not total or n_failed / total <= max_share:
        return None
    return (f"RUN FAILED: {n_failed} of {total} {what} failed ({why + '; ' if why else ''}more than "
            f"--max-failed-share {max_share:g})")


def check_tracking(args, command: str, *, always: bool = False) -> None:
    """Before any work: when the run will record to MLflow (no ``--no-mlflow``, or ``--trace``; ``always``: a
    command that only records, like ``register``), open the tracking store (``--tracking-uri``,
    ``$MLFLOW_TRACKING_URI`` or the project's) and check that it answers; a bad or hanging store is one line and
    exit status 2 within a few seconds, not a warning after the work."""
    if not always and getattr(args, "no_mlflow", True) and not getattr(args, "trace", False):
        return
    from halluscope.tracking.runs import TrackingStoreError, check_tracking_store  # mlflow: only when tracking

    try:
        check_tracking_store(getattr(args, "tracking_uri", None))
    except TrackingStoreError as e:
        hint = " (--no-mlflow runs without tracking)" if hasattr(args, "no_mlflow") else ""
        if not getattr(args, "tracking_uri", None) and not os.environ.get("MLFLOW_TRACKING_URI"):  # the default
            hint += f"; {paths.home_hint()}"
        print(f"halluscope {command}: error: argument --tracking-uri: {e}; nothing was run{hint}", file=sys.stderr)
        raise SystemExit(2) from None


class _WithoutDSPy:
    """A text stream that passes writes on to ``stream``, except those made by DSPy's code (its ``print`` calls,
    its tqdm bars, its log handler): the frames above the write are walked past tqdm, logging and contextlib to
    the code that wrote."""

    _PASS = ("tqdm", "logging", "contextlib", "io", "codecs")

    def __init__(self, stream):
        self._stream = stream

    def _from_dspy(self) -> bool:
        frame = sys._getframe(2)
        for _ in range(16):
            if frame is None:
                return False
            module = frame.f_globals.get("__name__", "")
            if module == "dspy" or module.startswith("dspy."):
                return True
            if module.split(".", 1)[0] not in self._PASS:
                return False
            frame = frame.f_back
        return False

    def write(self, text: str) -> int:
        return len(text) if self._from_dspy() else self._stream.write(text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def without_dspy_output(show: bool = False):
    """Hide what DSPy itself writes while the block runs (unless ``show``): its optimizers' ``print`` calls
    ("Bootstrapping set 1/6", the program's source, proposed instructions), its "Processed N / M examples" and
    other progress bars, and its INFO/WARNING log lines, which fill a terminal with hundreds of lines per fold.
    halluscope's own lines, and DSPy's errors, still show."""
    if show:
        yield
        return
    dspy_logger = logging.getLogger("dspy")
    level, out, err = dspy_logger.level, sys.stdout, sys.stderr
    dspy_logger.setLevel(logging.ERROR)
    sys.stdout, sys.stderr = _WithoutDSPy(out), _WithoutDSPy(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        dspy_logger.setLevel(level)


def add_lm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("language model")
    g.add_argument("--lm", default=os.environ.get("HALLUSCOPE_LM", "local"),
                   help="'local' (embedded SmolLM2-135M, the default), 'local:/path/model.gguf', or any DSPy/LiteLLM "
                        "model string such as openai/gpt-4o-mini, ollama_chat/llama3.1, hosted_vllm/NAME")
    g.add_argument("--api-base", default=os.environ.get("HALLUSCOPE_API_BASE"),
                   help="base URL of an OpenAI-compatible server (vLLM, Ollama, llama.cpp server)")
    g.add_argument("--api-key", default=None, help="API key (default: the provider's usual environment variable)")
    g.add_argument("--max-tokens", type=TOKENS, default=512, help="max tokens per LM call (default 512)")
    g.add_argument("--temperature", type=ranged(number(0, 2)), default=0.0,
                   help="sampling temperature of the LM (default 0: the same answer every time)")
    g.add_argument("--adapter", choices=["json", "chat"], default=None,
                   help="DSPy adapter (default: json for the embedded model, chat otherwise)")
    g.add_argument("--cache-dir", default=None, help="DSPy disk cache folder (default .cache/dspy or $HALLUSCOPE_CACHE_DIR)")
    g.add_argument("--response-schema", choices=["auto", "on", "off"], default="auto",
                   help="send each stage's JSON schema and output budget to the server (response_format, max_tokens); "
                        "auto: on with --api-base unless --adapter chat")
    g.add_argument("--lm-timeout", type=SECONDS, default=None, help="seconds per LM request to a server")
    g.add_argument("--lm-retries", type=RETRIES, default=None, help="retries of a failed LM request (DSPy's default: 3)")


def add_data_args(p: argparse.ArgumentParser) -> None:
    """``--dataset`` and the data arguments; what ``--lang``/``--task``/``--split`` mean is each dataset's
    :class:`~halluscope.loaders.dataset_registry.DatasetSpec` (the help text is read from the registry)."""
    specs = dataset_specs()

    def roles(attr: str) -> str:
        used = [f"{s.name}: {getattr(s, attr).meaning}" for s in specs if getattr(s, attr).meaning]
        unused = [s.name for s in specs if not getattr(s, attr).meaning]
        return "; ".join(used) + (f" (not used by {', '.join(unused)})" if unused else "")

    g = p.add_argument_group("data")
    g.add_argument("--dataset", choices=[s.name for s in specs], default=None,
                   help="; ".join(f"{s.name}: {s.description}" for s in specs)
                        + " (default: halluclean when --task is given, else mushroom)")
    g.add_argument("--lang", default=None, help=roles("lang"))
    g.add_argument("--task", default=None, help=roles("task"))
    g.add_argument("--split", default=None,
                   help="; ".join(f"{s.name}: {'|'.join(s.splits)} (default {s.default_split})" if s.splits
                                  else f"{s.name}: a split of the source (needed when it has several)"
                                  for s in specs))
    g.add_argument("--data-dir", default=None,
                   help="mushroom: the data root (with val/ and context/) or a JSONL file; halluclean: its folder; "
                        "generic: the file, folder or Hub name. Default $HALLUSCOPE_DATA_DIR (mushroom) / "
                        "$HALLUSCOPE_HALLUCLEAN_DIR (halluclean), else the built-in demo set")
    g.add_argument("--column", action="append", metavar="FIELD=COLUMN", default=None,
                   help="generic: the column holding a field of the common schema, e.g. --column answer=response "
                        "(repeatable; fields: " + ", ".join(FIELDS) + ")")
    g.add_argument("--context", choices=list(CONTEXT_VARIANTS), default="native",
                   help="retrieved context given to the detector (mushroom); none drops the context column "
                        "(generic)")
    g.add_argument("--limit", type=ITEMS, default=None, help="only the first N items (cases)")


class InputError(ValueError):
    """Bad input the user must fix (a malformed data file, a missing one): the command prints the message as one
    line, ``<command>: error: ...``, and exits 2 (:func:`run_command`); with ``--debug`` it raises, traceback
    and cause included."""


def add_debug_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of an input error instead of the one-line message")


def run_command(args, func=None) -> int:
    """``func(args)`` (default ``args.func``); an :class:`InputError` (or a model path that is no GGUF model,
    :class:`~halluscope.lm.llamacpp.ModelFileError`) becomes one line on stderr and exit status 2,
    unless ``--debug`` was given (then it propagates with its traceback)."""
    func = func or args.func
    try:
        return func(args)
    except (InputError, ModelFileError) as e:  # ModelFileError: --lm local:PATH or --model PATH is no GGUF model
        if getattr(args, "debug", False):
            raise
        command = getattr(args, "command", None)
        prog = "optimize.py" if command is None else f"halluscope {command}"
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def resolve_dataset(args) -> str:
    """``--dataset``, defaulting to HalluClean when a ``--task`` is named and to Mu-SHROOM otherwise."""
    if getattr(args, "dataset", None) is None:
        args.dataset = "halluclean" if getattr(args, "task", None) else "mushroom"
    return args.dataset


def usage_error(args, message: str) -> NoReturn:
    """Print ``halluscope <command>: error: message`` and exit with status 2 (argparse's usage error)."""
    command = getattr(args, "command", None)
    print(f"{'halluscope ' + command if command else 'halluscope'}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_data_args(args) -> DatasetSpec:
    """The dataset ``args`` name, with ``args.lang``/``args.task``/``args.split`` checked and normalised by its
    spec (task aliases resolved, the default split filled in). An argument the dataset refuses or needs is
    a usage error (exit status 2) naming it."""
    spec = get_dataset(resolve_dataset(args))
    try:
        args.columns = parse_column_mapping(getattr(args, "column", None))
        args.lang, args.task, args.split = spec.check_args(lang=args.lang, task=args.task, split=args.split,
                                                           columns=args.columns)
    except DatasetArgumentError as e:
        usage_error(args, str(e))
    if args.limit is not None and args.limit < 1:
        usage_error(args, f"argument --limit: must be at least 1, not {args.limit}")
    return spec


def load_examples(args, spec: DatasetSpec | None = None) -> tuple[list, str]:
    """The examples the data arguments name (checked by :func:`check_data_args`, unless the caller did and passes
    the dataset's ``spec`` it returned), and a short description of where they came from. The key results are
    recorded under is ``get_dataset(args.dataset).key(args.lang, args.task, examples)``."""
    spec = spec if spec is not None else check_data_args(args)
    try:
        examples, source = spec.load(args.data_dir, lang=args.lang, task=args.task, split=args.split,
                                     context=args.context, limit=args.limit, columns=args.columns)
    except DatasetArgumentError as e:
        usage_error(args, str(e))
    except (ValueError, OSError) as e:  # the loaders name the file, line and field: one line (run_command)
        raise InputError(one_line(e)) from e
    return examples, source


def one_line(error: Exception) -> str:
    """An exception's message on one line (a loader's message may list tried paths on several)."""
    text = " ".join(part.strip() for part in str(error).splitlines() if part.strip())
    return text or type(error).__name__


def setup_lm(args, *, needed: bool = True):
    if not needed:
        return None
    schema = {"auto": None, "on": True, "off": False}[getattr(args, "response_schema", "auto")]
    server = {k: v for k, v in (("timeout", getattr(args, "lm_timeout", None)),
                                ("num_retries", getattr(args, "lm_retries", None))) if v is not None}
    try:
        lm = configure(args.lm, cache_dir=args.cache_dir, adapter=args.adapter, api_base=args.api_base,
                       api_key=args.api_key, max_tokens=args.max_tokens, temperature=args.temperature,
                       response_schema=schema, **server)
    except (UnsafeFolderError, CacheFolderError) as e:  # a cache others can write, or not even you: one line, exit 2
        raise InputError(str(e)) from e
    try:  # once, before any item: a run where every item would fail stops here
        check_lm(lm, timeout=getattr(args, "lm_timeout", None) or 60.0)
    except LMCheckError as e:
        print(f"halluscope: LM check failed, nothing was run: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    return lm
