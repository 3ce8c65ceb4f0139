"""The ``halluscope`` command line: ``evaluate`` (here), plus ``detect`` and ``compare`` (optimize/commands.py).

    halluscope evaluate --program spans --lang de --split val --data-dir ../shared/data/mushroom --lm local
    halluscope evaluate --program halluclean --dataset halluclean --task qa --limit 10
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = PROJECT_ROOT / "outputs"


def parse_options(pairs: list[str] | None) -> dict:
    """``["reasoning=true", "shift=0.5", "samplers=[\\"local\\"]"]`` -> typed dict (JSON values, else strings)."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise argparse.ArgumentTypeError(f"program option {pair!r} is not KEY=VALUE")
        k, v = pair.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


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
    from loaders.mushroom import CONTEXT_VARIANTS, LANGS, SPLITS

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
        from loaders.halluclean import HALLUCLEAN_TASKS, halluclean_demo, load_halluclean

        if args.task not in HALLUCLEAN_TASKS:
            raise SystemExit(f"--task is required with --dataset halluclean; choose one of: {', '.join(HALLUCLEAN_TASKS)}")
        data_dir = args.data_dir or os.environ.get("HALLUSCOPE_HALLUCLEAN_DIR")
        if data_dir is None:
            print("!!! USING THE BUILT-IN HALLUCLEAN DEMO CASES — pass --data-dir ../shared/data/halluclean "
                  "or set HALLUSCOPE_HALLUCLEAN_DIR for real data !!!", file=sys.stderr)
            examples = halluclean_demo(args.task)
            return (examples[: args.limit] if args.limit else examples), f"halluclean-demo/{args.task}"
        return load_halluclean(data_dir, args.task, limit=args.limit), f"halluclean/{args.task}"

    from loaders.demo import DEMO_NOTICE, demo_data_dir
    from loaders.mushroom import load_mushroom, resolve_data_dir

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


def cmd_evaluate(args) -> int:
    from halluscope.evaluate import run_eval
    from programs.registry import get

    spec = get(args.program)
    options = {**spec.options, **parse_options(args.option)}
    examples, source = load_examples(args)
    if not examples:
        raise SystemExit(f"no examples to evaluate in {source}")
    lm = setup_lm(args, needed=spec.uses_lm)
    program = spec.build(**options)
    print(f"evaluating {spec.name} on {len(examples)} items of {source}"
          f"{' with ' + lm.model if lm is not None else ''}", file=sys.stderr)
    result = run_eval(program, examples, threads=args.threads, progress=not args.no_progress,
                      extra_inputs=spec.extra_inputs, report=spec.report)
    summary = result.summary()
    if lm is not None and hasattr(lm.engine, "stats"):
        summary["engine_truncated_prompts"] = lm.engine.stats.truncated
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    out_dir = Path(args.out_dir) / f"{spec.name}-{source.replace('/', '_').replace('=', '-')}-{stamp}"
    files = write_outputs(out_dir, spec.name, examples, result, args.dataset)
    print_summary(spec.name, source, summary, result)
    print(f"predictions: {', '.join(str(f) for f in files)}")
    if not args.no_mlflow:
        try:
            from optimize.tracking import track_run
        except ModuleNotFoundError:
            track_run = None
        if track_run is not None:
            params = {"program": spec.name, "source": source, "lm": lm.model if lm is not None else "none",
                      "threads": args.threads, "limit": args.limit, "context": args.context,
                      "options": json.dumps(options, sort_keys=True)}
            run_id = track_run("evaluate", program=spec.name, lang=args.lang or args.task, params=params,
                               metrics={k: v for k, v in summary.items() if isinstance(v, (int, float))},
                               artifacts=files, tracking_uri=args.tracking_uri)
            print(f"mlflow run: {run_id}")
    return 0


def write_outputs(out_dir: Path, program: str, examples, result, dataset: str) -> list[Path]:
    """The official submission JSONL (Mu-SHROOM) and every prediction in the common contract."""
    from loaders.mushroom import write_submission

    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    if dataset == "mushroom":
        ok = [(ex.id, p) for ex, p in zip(examples, result.predictions)]
        sub = out_dir / f"{program}.submission.jsonl"
        write_submission(sub, [i for i, _ in ok],
                         [p if p is not None else {"hard_labels": [], "soft_labels": []} for _, p in ok])
        files.append(sub)
    full = out_dir / f"{program}.predictions.jsonl"
    with open(full, "w", encoding="utf-8") as f:
        for ex, p in zip(examples, result.predictions):
            row = {"id": ex.get("id"), "ok": p is not None}
            if p is not None:
                row.update(p.detection.to_dict() if hasattr(p, "detection") else dict(p))
                # program-specific extras (samples, ratings, plan, verdict, ...) for debugging
                extras = {k: v for k, v in p.items() if k not in row and k not in _CONTRACT_FIELDS}
                if extras:
                    row["extra"] = extras
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    files.append(full)
    summ = out_dir / f"{program}.summary.json"
    summ.write_text(json.dumps({"summary": result.summary(), "errors": result.errors[:50], "report": result.report},
                               indent=2, default=str), encoding="utf-8")
    files.append(summ)
    return files


_CONTRACT_FIELDS = {"detection", "spans", "soft_labels", "hard_labels", "label", "score", "rationale", "revision",
                    "units", "failures"}


def print_summary(program: str, source: str, summary: dict, result) -> None:
    print(f"\n== {program} on {source} ==")
    for key in ("iou", "corr", "maxiou", "accuracy", "precision", "recall", "f1", "balanced_accuracy"):
        if key in summary:
            print(f"{key:>18}: {summary[key]:.4f}")
    fails = {k: v for k, v in summary.items() if k.startswith("failures_")}
    print(f"{'failures':>18}: {sum(fails.values())} {json.dumps({k[9:]: v for k, v in fails.items()}) if fails else ''}")
    print(f"{'LM calls':>18}: {summary['lm_calls']} ({summary['lm_cache_hits']} from cache), "
          f"{summary['lm_calls_per_item']} per item")
    print(f"{'tokens':>18}: {summary['lm_input_tokens']} in, {summary['lm_output_tokens']} out")
    print(f"{'wall time':>18}: {summary['seconds']:.1f} s ({summary['seconds_per_item']:.2f} s per item)")
    for k, v in result.report.items():
        print(f"{k:>18}: {v}")
    for e in result.errors[:5]:
        print(f"  error: {e}")


def build_parser() -> argparse.ArgumentParser:
    from programs.registry import names

    parser = argparse.ArgumentParser(prog="halluscope", description="Find and fix hallucinations in LLM answers.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="run a detector on a labelled dataset and score it")
    ev.add_argument("--program", choices=names(), default="spans")
    ev.add_argument("--option", "-O", action="append", metavar="KEY=VALUE",
                    help="program build option, e.g. -O reasoning=true (repeatable)")
    add_data_args(ev)
    add_lm_args(ev)
    ev.add_argument("--threads", type=int, default=1)
    ev.add_argument("--out-dir", default=str(DEFAULT_OUT), help="where predictions are written (default outputs/)")
    ev.add_argument("--no-progress", action="store_true")
    ev.add_argument("--no-mlflow", action="store_true", help="do not record an MLflow run")
    ev.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite store in the project)")
    ev.set_defaults(func=cmd_evaluate)
    try:
        from optimize.commands import add_commands
    except ModuleNotFoundError as e:
        if e.name not in ("optimize.commands",):
            raise
    else:
        add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
