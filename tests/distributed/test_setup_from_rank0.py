"""Distributed set-up reads the weights once: rank 0 loads the checkpoint, every other
rank builds the model on the meta device, and both the policy and the held reference
receive rank 0's weights into their FSDP2 shards (trainer.distributed.load_from_rank0).

Pinned at world size 2 on CPU (gloo), GRPO (a fixed, held reference) stored in bf16,
full float32 weights of size M: rank 1 never opens model.safetensors; until its weights
are in place its peak resident memory grows by less than 1.5 M (its shards are 0.5 M of
policy and 0.25 M of reference; the old set-up held the full policy plus the full bf16
reference copy, 1.5 M, before sharding; measured: 1.07 M new, 2.2 M old); and the set-up
models equal world size 1's exactly (weights, reference weights, log-probs of both on a
fixed batch).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_fsdp_cpu import ENV, TORCHRUN

HERE = Path(__file__).resolve().parent
PROBE = str(HERE / "setup_probe.py")


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A random Llama of ~28M parameters (112 MB in float32): big enough that one full
    copy dwarfs the noise in a process's peak resident memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.tiny import TinyConfig, build_tokenizer

    out = tmp_path_factory.mktemp("wide") / "model"
    tok = build_tokenizer(TinyConfig())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1536,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      head_dim=64, max_position_embeddings=256, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def run_probe(cmd: list[str], model: Path, out: Path) -> list[dict]:
    out.mkdir()
    cfg = {"run_id": out.name, "out_dir": str(out / "run"), "seed": 0,
           "model": {"path": str(model), "device": "cpu", "reference_dtype": "bfloat16"},
           "method": {"name": "GRPO"}, "rollout": {"n": 4, "prompts_per_step": 4},
           "tracking": {"mlflow_uri": None, "progress": False}}
    config = out / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([*cmd, PROBE, str(config), str(out)], env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_only_rank_0_reads_the_weights_and_set_up_equals_world_size_1(wide_model, tmp_path):
    weights_file = str(wide_model / "model.safetensors")
    full_bytes = (wide_model / "model.safetensors").stat().st_size

    one = run_probe([sys.executable], wide_model, tmp_path / "one")
    two = run_probe(TORCHRUN, wide_model, tmp_path / "two")
    assert one[0]["opened"] == [weights_file]
    assert [r["rank"] for r in two] == [0, 1]
    assert two[0]["opened"] == [weights_file]
    assert two[1]["opened"] == []
    grown = two[1]["rss_growth_bytes"]
    assert grown < 1.5 * full_bytes, f"rank 1 grew {grown / full_bytes:.2f} x the weights"

    a, b = torch.load(tmp_path / "one" / "tensors.pt"), torch.load(tmp_path / "two" / "tensors.pt")
    for key in ("weights", "ref_weights"):
        assert a[key].keys() == b[key].keys() and len(a[key]) > 0
        for name, w in a[key].items():
            assert torch.equal(b[key][name], w), (key, name)
    assert {w.dtype for w in b["ref_weights"].values()} == {torch.bfloat16}
    torch.testing.assert_close(b["logp"], a["logp"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b["ref_logp"], a["ref_logp"], rtol=1e-5, atol=1e-6)
