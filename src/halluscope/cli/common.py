"""Arguments every command shares (LM, data, program options) and what they resolve to."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")



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
    from halluscope.programs.registry import OptionError

    try:
        return spec.check_options(out)
    except OptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_lm_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("language model")
    g.add_argument("--lm", default=os.environ.get("HALLUSCOPE_LM", "local"),
                   help="'local' (embedded SmolLM2-135M, the default), 'local:/path/model.gguf', or any DSPy/LiteLLM "
                        "model string such as openai/gpt-4o-mini, ollama_chat/llama3.1, hosted_vllm/NAME")
    g.add_argument("--api-base", default=os.environ.get("HALLUSCOPE_API_BASE"),
                   help="base URL of an OpenAI-compatible server (vLLM, Ollama, llama.cpp server)")
    g.add_argument("--api-key", default=None, help="API key (default: the provider's usual environment variable)")
    g.add_argument("--max-tokens", type=int, default=512, help="max tokens per LM call (default 512)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--adapter", choices=["json", "chat"], default=None,
                   help="DSPy adapter (default: json for the embedded model, chat otherwise)")
    g.add_argument("--cache-dir", default=None, help="DSPy disk cache folder (default .cache/dspy or $HALLUSCOPE_CACHE_DIR)")


def add_data_args(p: argparse.ArgumentParser, *, lang_required: bool = False) -> None:
    from halluscope.loaders.mushroom import CONTEXT_VARIANTS, LANGS, SPLITS

    g = p.add_argument_group("data")
    g.add_argument("--dataset", choices=["mushroom", "halluclean"], default=None,
                   help="default: halluclean when --task is given, else mushroom")
    g.add_argument("--lang", choices=list(LANGS), default=None if not lang_required else "en",
                   help="Mu-SHROOM language (default: en for the demo set, required for real data)")
    g.add_argument("--split", choices=list(SPLITS), default="val")
    g.add_argument("--data-dir", default=None,
                   help="Mu-SHROOM root (with val/ and context/) or the HalluClean folder; default $HALLUSCOPE_DATA_DIR "
                        "(Mu-SHROOM) / $HALLUSCOPE_HALLUCLEAN_DIR (HalluClean), else the built-in demo set")
    g.add_argument("--context", choices=list(CONTEXT_VARIANTS), default="native",
                   help="retrieved context given to the detector (Mu-SHROOM)")
    g.add_argument("--task", default=None, help="HalluClean task: qa, dialogue, summarization, mwp, self_contradiction")
    g.add_argument("--limit", type=int, default=None, help="only the first N items (cases)")


def resolve_dataset(args) -> str:
    """``--dataset``, defaulting to HalluClean when a ``--task`` is named and to Mu-SHROOM otherwise."""
    if getattr(args, "dataset", None) is None:
        args.dataset = "halluclean" if getattr(args, "task", None) else "mushroom"
    return args.dataset


def load_examples(args) -> tuple[list, str]:
    """The examples the data arguments name, and a short description of where they came from."""
    resolve_dataset(args)
    if args.limit is not None and args.limit < 1:
        raise SystemExit(f"--limit must be at least 1, not {args.limit}")
    if args.dataset == "halluclean":
        from halluscope.loaders.halluclean import HALLUCLEAN_TASKS, halluclean_demo, load_halluclean

        if args.task not in HALLUCLEAN_TASKS:
            raise SystemExit(f"--task is required with --dataset halluclean; choose one of: {', '.join(HALLUCLEAN_TASKS)}")
        data_dir = args.data_dir or os.environ.get("HALLUSCOPE_HALLUCLEAN_DIR")
        if data_dir is None:
            print("!!! USING THE BUILT-IN HALLUCLEAN DEMO CASES — pass --data-dir ../shared/data/halluclean "
                  "or set HALLUSCOPE_HALLUCLEAN_DIR for real data !!!", file=sys.stderr)
            examples = halluclean_demo(args.task)
            return (examples[: args.limit] if args.limit else examples), f"halluclean-demo/{args.task}"
        return load_halluclean(data_dir, args.task, limit=args.limit), f"halluclean/{args.task}"

    from halluscope.loaders.demo import DEMO_NOTICE, demo_data_dir
    from halluscope.loaders.mushroom import load_mushroom, resolve_data_dir

    root = resolve_data_dir(args.data_dir)
    lang = args.lang
    if root is None:
        print(DEMO_NOTICE, file=sys.stderr)
        root = demo_data_dir()
        lang = args.lang = lang or "en"  # the resolved language is what gets recorded
        source = "demo"
    else:
        if lang is None and Path(root).is_dir():
            raise SystemExit("--lang is required with a Mu-SHROOM data directory")
        source = "mushroom"
    examples = load_mushroom(root, lang=lang, split=args.split, context=args.context, limit=args.limit)
    return examples, f"{source}/{lang}/{args.split}/context={args.context}"


def setup_lm(args, *, needed: bool = True):
    from halluscope.lm import configure

    if not needed:
        return None
    return configure(args.lm, cache_dir=args.cache_dir, adapter=args.adapter, api_base=args.api_base,
                     api_key=args.api_key, max_tokens=args.max_tokens, temperature=args.temperature)


