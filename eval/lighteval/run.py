"""Evaluate one checkpoint on one exported benchmark with lighteval (the cross-check stage).

Runs with lighteval's own interpreter (workflow/envs/lighteval.txt), by path, because the
project is not installed there; it uses only the standard library, `datasets` and lighteval:

    results/envs/lighteval/bin/python eval/lighteval/run.py --checkpoint CKPT \\
        --benchmark toy --benchmark-dir results/x/crosscheck/benchmarks/toy --n 4 \\
        --temperature 1.0 --top-p 1.0 --max-new-tokens 48 --backend hf --out OUT.json

Order of work, so that a bad setup fails before any weights load, with one line naming the
file and the fix (exit status 2): lighteval importable; the checkpoint a model directory;
the benchmark folder readable by `datasets` (what lighteval reads it with) with the columns
the task needs; n > 1 only with temperature > 0. Then the checkpoint gets a *view* (a folder
of links to its files) whose generation_config.json states every sampling setting: lighteval's
transformers backend never passes `do_sample`, so a checkpoint whose config lacks
`"do_sample": true` would silently decode greedily; vLLM also takes unset settings (top_k,
repetition_penalty) from that file. The view is checked to sample before lighteval starts.
lighteval's results JSON is copied to --out (`python -m eval.lighteval_convert convert` turns
it into our summary schema).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TASKS_FILE = Path(__file__).resolve().with_name("tasks.py")
# The sampling settings our samplers use (eval/samplers.py): plain softmax at the temperature,
# nucleus top_p, everything else neutral. Written into the view's generation_config.json.
NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "num_beams": 1}


class SetupError(ValueError):
    """A setup lighteval cannot evaluate; the message names the file and the fix."""


def check_lighteval() -> str:
    """lighteval's version, or a SetupError saying how to build its environment."""
    try:
        from importlib.metadata import version

        import lighteval  # noqa: F401
    except ImportError as err:
        raise SetupError(f"lighteval is not importable by {sys.executable} ({err}); build its "
                         "environment with the workflow rule lighteval_env "
                         "(workflow/envs/lighteval.txt)") from None
    return version("lighteval")


def check_checkpoint(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise SetupError(f"checkpoint {path}: no config.json; pass a Hugging Face model directory")


def check_benchmark(folder: Path, name: str) -> int:
    """Rows in the benchmark folder, read the way lighteval reads it (datasets' json loader)."""
    files = sorted(folder.glob("*.jsonl"))
    if len(files) != 1:
        raise SetupError(f"benchmark {name}: {folder} must hold exactly one .jsonl (found "
                         f"{[f.name for f in files]}); write it with "
                         "`python -m eval.lighteval_convert export`")
    import datasets

    try:
        rows = datasets.load_dataset(str(folder), split="train")
    except Exception as err:  # datasets raises many types for an unreadable file
        raise SetupError(f"benchmark {name}: lighteval cannot read {files[0]} with datasets "
                         f"({type(err).__name__}: {err}); re-export it") from None
    missing = sorted({"query", "answer"} - set(rows.column_names))
    if missing or len(rows) == 0:
        raise SetupError(f"benchmark {name}: {files[0]} has {len(rows)} rows and lacks columns "
                         f"{missing}; re-export it with `python -m eval.lighteval_convert export`")
    return len(rows)


def greedy_reason(config: dict, n: int) -> str | None:
    """Why a generation config would not sample n independent answers (None: it samples)."""
    if config.get("do_sample") is not True:
        return "its generation_config.json lacks \"do_sample\": true (lighteval's transformers " \
            "backend then decodes greedily, whatever the temperature)"
    if n > 1 and not config.get("temperature"):
        return f"temperature {config.get('temperature')} with n={n} gives n identical answers"
    return None


def sampling_view(checkpoint: Path, view: Path, temperature: float, top_p: float,
                  max_new_tokens: int) -> dict:
    """A folder of links to `checkpoint`'s files with an explicit generation_config.json."""
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    for item in checkpoint.iterdir():
        if item.name != "generation_config.json":
            (view / item.name).symlink_to(item.resolve())
    original = checkpoint / "generation_config.json"
    config = json.loads(original.read_text()) if original.is_file() else {}
    config.update(NEUTRAL, do_sample=temperature > 0, temperature=temperature, top_p=top_p,
                  max_new_tokens=max_new_tokens)
    (view / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def model_args(view: Path, args: argparse.Namespace) -> str:
    """lighteval's model argument string; the sampling settings are stated here as well.

    The transformers backend gets no max_new_tokens here: lighteval 0.13 then tokenizes the
    *prompt* with max_length=max_new_tokens and cuts its head off whenever the prompt is
    longer (the tiny default's 70-token prompt at 48 new tokens lost its first 22 tokens,
    and Mean@4 fell from 0.34 to 0.05). The task's generation_size (tasks.py) sets the
    length instead, and lighteval then sizes the context as prompt + generation_size."""
    gen = f"temperature:{args.temperature},top_p:{args.top_p},top_k:0,seed:{args.seed}"
    if args.backend == "vllm":
        return (f"model_name={view},dtype={args.dtype},gpu_memory_utilization=0.8,"
                f"generation_parameters={{{gen},max_new_tokens:{args.max_new_tokens}}}")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "float32" if device == "cpu" else args.dtype
    return (f"model_name={view},dtype={dtype},device={device},batch_size={args.batch_size},"
            f"generation_parameters={{{gen}}}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eval/lighteval/run.py", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--benchmark", required=True)
    p.add_argument("--benchmark-dir", required=True, type=Path, help="the export folder")
    p.add_argument("--out", required=True, type=Path, help="lighteval's results JSON, copied")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--dtype", default="bfloat16", help="on GPU; CPU always uses float32")
    p.add_argument("--batch-size", type=int, default=16, help="hf backend")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    work = args.out.parent / f"{args.out.stem}.lighteval"
    try:
        version = check_lighteval()
        check_checkpoint(args.checkpoint)
        rows = check_benchmark(args.benchmark_dir, args.benchmark)
        if args.n > 1 and args.temperature == 0:
            raise SetupError(f"n={args.n} at temperature 0: every sample would be the same "
                             "answer; set eval.temperature > 0 or eval.n: 1")
        config = sampling_view(args.checkpoint, work / "model", args.temperature, args.top_p,
                               args.max_new_tokens)
        if args.temperature > 0 and (reason := greedy_reason(config, args.n)):
            raise SetupError(f"checkpoint view {work / 'model'}: {reason}")
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"lighteval {version}: {args.benchmark} ({rows} problems) x n={args.n} on "
          f"{args.checkpoint} ({args.backend})", flush=True)
    env = {**os.environ, "RPG_BENCHMARK": args.benchmark,
           "RPG_BENCHMARK_DIR": str(args.benchmark_dir.resolve()), "RPG_N": str(args.n),
           "RPG_MAX_NEW_TOKENS": str(args.max_new_tokens)}
    for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # every input is a local folder
        env.setdefault(offline, "1")
    command = "vllm" if args.backend == "vllm" else "accelerate"
    raw = work / "raw"
    subprocess.run([sys.executable, "-m", "lighteval", command, model_args(work / "model", args),
                    f"{args.benchmark}_local|0", "--custom-tasks", str(TASKS_FILE),
                    "--output-dir", str(raw)], env=env, check=True)
    found = sorted(raw.glob("results/**/results_*.json"))
    if not found:
        print(f"error: lighteval wrote no results_*.json under {raw}", file=sys.stderr)
        return 1
    shutil.copyfile(found[-1], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
