"""`python -m eval --backend vllm` for real on CPU against `--backend hf` on the toy benchmark.

Same checkpoint, float32 both: greedy completions are identical problem by problem, vLLM
sees exactly the prompt ids transformers sees, and sampled Mean@8 agrees within a paired
two-sample interval. A sampler that drops the chat template's special tokens, adds a BOS,
applies a checkpoint's top-k, or misreads the temperature fails one of these.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _vllm_cli import run_cli

pytestmark = pytest.mark.slow


def _eval(model: Path, out: Path, backend: str, *extra: str) -> list[dict]:
    run_cli("eval", "--checkpoint", str(model), "--benchmark", "toy", "--backend", backend,
            "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "40", "--seed", "0",
            "--no-progress", "--out", str(out / backend), *extra)
    return [json.loads(x) for x in (out / backend / "toy.jsonl").read_text().splitlines()]


def _per_problem_accuracy(records: list[dict]) -> dict[str, float]:
    hits: dict[str, list[bool]] = {}
    for r in records:
        hits.setdefault(r["problem_id"], []).append(r["scorers"]["math_verify"]["correct"])
    return {k: sum(v) / len(v) for k, v in hits.items()}


def test_vllm_and_hf_sample_the_same_prompts_and_distribution(vllm_tiny, vllm_engine_probe,
                                                              tmp_path):
    # Prompt ids: vLLM's own record of what it was given vs hf_generate's encoding.
    proc = vllm_engine_probe
    assert "identical prompt ids for 121 prompts" in proc.stdout, (
        proc.stdout[-2000:] + proc.stderr[-4000:])

    # Greedy: the same tokens, problem by problem.
    greedy = {b: _eval(vllm_tiny, tmp_path / "greedy", b, "--n", "1", "--temperature", "0")
              for b in ("hf", "vllm")}
    assert len(greedy["hf"]) == 121
    mismatched = [h["problem_id"] for h, v in zip(greedy["hf"], greedy["vllm"])
                  if h["completion"] != v["completion"]]
    assert mismatched == [], mismatched

    # Sampled Mean@8: paired difference over problems within 4 standard errors.
    acc = {b: _per_problem_accuracy(_eval(vllm_tiny, tmp_path / "sampled", b, "--n", "8"))
           for b in ("hf", "vllm")}
    diffs = [acc["hf"][k] - acc["vllm"][k] for k in acc["hf"]]
    n = len(diffs)
    mean = sum(diffs) / n
    se = (sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) ** 0.5
    hf_mean = sum(acc["hf"].values()) / n
    assert 0.03 < hf_mean < 0.97  # accuracy away from 0 and 1: the comparison has power
    assert abs(mean) <= 4 * se, (hf_mean, mean, se)


def test_vllm_many_checkpoints_one_engine_equal_one_engine_each(vllm_tiny, tmp_path):
    """`python -m eval --backend vllm` on two checkpoints in one process (one vLLM start-up,
    weights reloaded in place for the second) writes the same files as one process each."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(vllm_tiny, ckpts / "step_1")
    moved = AutoModelForCausalLM.from_pretrained(vllm_tiny)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    shutil.copytree(vllm_tiny, ckpts / "step_2")
    moved.save_pretrained(ckpts / "step_2")
    common = ["--benchmark", "toy", "--backend", "vllm", "--dtype", "float32", "--limit", "8",
              "--n", "2", "--max-new-tokens", "16", "--seed", "0", "--no-progress"]
    run_cli("eval", "--checkpoint", str(ckpts / "step_1"), str(ckpts / "step_2"),
            "--out", str(tmp_path / "together" / "step_{step}"), *common)
    for step in (1, 2):
        run_cli("eval", "--checkpoint", str(ckpts / f"step_{step}"),
                "--out", str(tmp_path / "alone" / f"step_{step}"), *common)
    for step in (1, 2):
        for name in ("toy.json", "toy.jsonl"):
            alone = (tmp_path / "alone" / f"step_{step}" / name).read_text()
            assert (tmp_path / "together" / f"step_{step}" / name).read_text() == alone
    texts = [(tmp_path / "together" / f"step_{s}" / "toy.jsonl").read_text() for s in (1, 2)]
    assert texts[0] != texts[1]  # the second checkpoint's weights were really used
