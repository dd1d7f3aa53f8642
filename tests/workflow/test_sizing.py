"""`python -m sweep.sizing`: the memory terms are the documented formulas, and every shipped
preset fits its GPU."""

from __future__ import annotations

import json

import pytest

from sweep.sizing import GPUS, PRESETS, GiB, estimate, preset_row


@pytest.fixture
def model_dir(tmp_path):
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 3, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_memory_terms_are_the_fsdp2_formulas(model_dir):
    # Per layer: q (64 x 4*16) + k, v (64 x 2*16 each) + o (4*16 x 64) + MLP 3 x 64 x 128.
    per_layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128
    params = 3 * per_layer + 100 * 64
    base = {"model": {"path": str(model_dir), "gradient_checkpointing": True},
            "rollout": {"vllm_gpu_memory_utilization": 0.5},
            "optim": {"max_tokens_per_micro_batch": 1000}}
    gpu = GPUS["h100"]
    r = estimate(base, gpus=4, gpu=gpu, keeps_reference=True)
    assert r["weights"] * GiB == pytest.approx(4 * params / 4)
    assert r["grads"] * GiB == pytest.approx(4 * params / 4)
    assert r["adamw"] * GiB == pytest.approx(8 * params / 4)
    assert r["reference"] * GiB == pytest.approx(2 * params / 4)  # held in bf16
    # checkpointed: every layer's bf16 input plus one layer's activations, per token, plus
    # one LM-head chunk's backward (8 float32 [8192 rows, V] buffers at V = 100)
    assert r["activations"] * GiB == pytest.approx(
        1000 * (3 * 64 * 2 + 2 * (10 * 64 + 4 * 128)) + 8 * 4 * 8192 * 100)
    assert r["vllm"] == pytest.approx(0.5 * gpu.memory_gib)
    assert r["total"] == pytest.approx(r["weights"] + r["adamw"] + r["reference"]
                                       + max(r["grads"] + r["activations"], r["vllm"]))
    no_ref = estimate(base, gpus=4, gpu=gpu, keeps_reference=False)
    assert no_ref["reference"] == 0


@pytest.mark.parametrize("paths", PRESETS, ids=lambda p: "+".join(p))
def test_every_shipped_preset_fits_an_80gb_gpu(paths):
    name, row = preset_row(paths, GPUS["h100"])
    assert row["total"] < GPUS["h100"].memory_gib, (name, row)
    assert row["rollout_min"] > 0 and row["update_min"] > 0


def test_update_flops_count_attention_the_reference_and_the_head_recompute(model_dir):
    """Per trained token: (old-logprob forward + reference forward + 3 x update) x (2P +
    causal attention at half the sequence) + the head's recompute; the time divides them by
    the MFU measured with or without checkpointing (its recompute is inside that MFU)."""
    from sweep.sizing import MEASURED_MFU

    per_layer = 64 * (4 + 2 * 2) * 16 + 4 * 16 * 64 + 3 * 64 * 128
    params = 3 * per_layer + 100 * 64
    tokens = 2 * 4 * (200 + 500)  # prompts 200 tokens, mean response 0.5 x 1000
    attention = 4 * 3 * (4 * 16) * (200 + 500) / 2
    gpu = GPUS["h100"]
    for ckpt in (True, False):
        base = {"model": {"path": str(model_dir), "gradient_checkpointing": ckpt},
                "rollout": {"prompts_per_step": 2, "n": 4, "max_new_tokens": 1000},
                "optim": {}}
        for keeps, forwards in ((True, 5), (False, 4)):
            r = estimate(base, gpus=1, gpu=gpu, keeps_reference=keeps)
            expect = tokens * (forwards * (2 * params + attention) + 2 * 100 * 64)
            assert r["update_tflop"] * 1e12 == pytest.approx(expect)
            assert r["update_min"] * 60 == pytest.approx(
                expect / (gpu.bf16_tflops * 1e12 * MEASURED_MFU[ckpt]))


def test_the_table_says_whether_a_job_fits_without_checkpointing(model_dir):
    from sweep.sizing import checkpointing_verdict, table

    base = {"model": {"path": str(model_dir), "gradient_checkpointing": True},
            "optim": {"max_tokens_per_micro_batch": 1000}}
    row = estimate(base, gpus=1, gpu=GPUS["h100"], keeps_reference=False)
    assert row["total_without_ckpt"] >= row["total"] - 1e-9
    assert checkpointing_verdict(row, 80).startswith("off fits")
    assert checkpointing_verdict({**row, "total_without_ckpt": 79.0}, 80) == "needed (79 GiB)"
    row.update(gpus=1, steps=10)
    assert "| off fits (" in table([("x", row)], "h100", 0.5)


def test_an_async_split_sizes_each_side_and_a_step_as_the_larger(model_dir):
    """rollout.gpus: 1 of 4: three trainer ranks share the states and have no vLLM term;
    the worker's GPU holds its share; one engine decodes every sequence, and a step takes
    the larger of generation and update. At rollout.gpus: 0 the worker beside rank 0 is
    awake while it trains: its share adds to the peak."""
    base = {"model": {"path": str(model_dir)}, "rollout": {"vllm_gpu_memory_utilization": 0.5}}
    gpu = GPUS["h100"]
    sync = estimate(base, gpus=4, gpu=gpu, keeps_reference=False)
    split = estimate({**base, "rollout": {**base["rollout"], "mode": "async", "gpus": 1}},
                     gpus=4, gpu=gpu, keeps_reference=False)
    assert split["weights"] == pytest.approx(sync["weights"] * 4 / 3)  # 3 trainer GPUs
    assert split["update_min"] == pytest.approx(sync["update_min"] * 4 / 3)
    assert split["vllm"] == 0 and split["worker_gpu"] == pytest.approx(0.5 * gpu.memory_gib)
    assert split["step_min"] == max(split["rollout_min"], split["update_min"])
    assert sync["step_min"] == pytest.approx(sync["rollout_min"] + sync["update_min"])
    assert split["total"] == pytest.approx(split["weights"] + split["adamw"] + split["grads"]
                                           + split["activations"])
    shared = estimate({**base, "rollout": {**base["rollout"], "mode": "async"}}, gpus=4,
                      gpu=gpu, keeps_reference=False)
    assert shared["total"] == pytest.approx(shared["weights"] + shared["adamw"]
                                            + shared["grads"] + shared["activations"]
                                            + shared["vllm"])


def test_host_memory_rounds_vllms_pinned_copy_per_tensor_to_a_power_of_two():
    """Qwen3-8B's bf16 weights are 15.3 GiB; asleep at level 1, vLLM's pinned copy takes
    about 20.9 GiB: each fused tensor rounded up (qkv 48 -> 64 MiB, gate_up 192 -> 256 MiB,
    down 96 -> 128 MiB, o 32 MiB exact, the embedding and the untied head 1.16 -> 2 GiB)."""
    from sweep.sizing import ARCHS, host_estimate, pinned

    mib_per_layer = 64 + 32 + 256 + 128  # qkv, o, gate_up, down: rounded by hand

    assert pinned(48 * 2**20) == 64 * 2**20 and pinned(32 * 2**20) == 32 * 2**20
    base = {"model": {"path": "Qwen/Qwen3-8B", "dtype": "bfloat16",
                      "lora": {"rank": 32, "target_modules": "all-linear"}},
            "rollout": {"engine": "vllm"}}
    host = host_estimate(base, {"gpus": 1, "mem_mb": 128000})
    layers = ARCHS["Qwen/Qwen3-8B"].layers
    assert host["pinned"] == pytest.approx((layers * mib_per_layer + 2 * 2048) / 1024)
    asleep_2 = host_estimate({**base, "rollout": {"engine": "vllm", "vllm_sleep_level": 2}},
                             {"gpus": 1, "mem_mb": 128000})
    assert asleep_2["pinned"] == 0 and host["total"] - asleep_2["total"] == host["pinned"]


def test_async_and_staleness_add_the_workers_copy_the_push_and_the_snapshots():
    from sweep.sizing import GiB, host_estimate

    base = {"model": {"path": "Qwen/Qwen3-8B"}, "rollout": {"mode": "async", "staleness": 2}}
    host = host_estimate(base, {"gpus": 8, "mem_mb": 800000})
    full = 8.19e9 * 4 / GiB  # float32 weights
    assert host["worker"] == pytest.approx(full) and host["hand_off"] == pytest.approx(full)
    assert host["staleness"] == pytest.approx(2 * full)  # every rank's slices, one node
    assert host["processes"] == pytest.approx(4.0 * 9)  # 8 ranks and the worker


def test_a_preset_that_passes_its_nodes_memory_is_refused(tmp_path, capsys):
    from sweep.sizing import main

    overlay = tmp_path / "small-node.yaml"
    overlay.write_text("resources:\n  train: {gpus: 1, cpus: 16, mem_mb: 32000, "
                       "runtime_min: 720}\n")
    assert main(["config/single-gpu-lora.yaml"]) == 0
    out = capsys.readouterr().out
    assert "peak / GPU" in out and "host / node" in out  # host memory beside GPU memory
    assert main(["config/single-gpu-lora.yaml", str(overlay)]) == 1
    err = capsys.readouterr().err
    assert "error: single-gpu-lora: about 40 GiB of host memory on the first node, more than " \
           "resources.train.mem_mb=32000" in err
