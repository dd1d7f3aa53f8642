"""LoRA (`model.lora`, trainer.lora): only the adapters train; the references equal a full
copy's on the same weights and hold none; checkpoints are plain HF models with the adapters
merged in (plus the adapters beside them); a resumed run equals an uninterrupted one; every
Table-3 method trains; the refusals name the key."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from common.generation.base import model_weights
from trainer import lora
from trainer.config import LoraSettings
from trainer.logprobs import pack, response_logprobs
from trainer.loop import Trainer, train
from trainer.reference import Reference

TABLE3 = ["GRPO", "DAPO", "RPG-UFKL", "RPG-URKL", "RPG-REINFORCE-UFKL", "RPG-REINFORCE-URKL"]


def _llama(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      pad_token_id=0)
    return LlamaForCausalLM(cfg).to(dtype).train()


def _batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (4, 7, 2)]
    responses = [torch.randint(1, 61, (n,), generator=g).tolist() for n in (5, 3, 6)]
    return pack(prompts, responses, pad_id=0)


def _train_adapters(model, steps: int, seed: int) -> None:
    """A few AdamW steps on the adapters (a fixed-seed objective), so B != 0."""
    opt = torch.optim.AdamW(lora.trainable(model), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    batch = _batch()
    for _ in range(steps):
        weights = torch.randn(batch.response_mask.shape, generator=gen, dtype=torch.float64)
        opt.zero_grad()
        (response_logprobs(model, batch)[0] * weights).sum().backward()
        opt.step()


def test_only_the_adapters_train_and_start_as_the_base():
    model = _llama()
    base = copy.deepcopy(model)
    lora.apply_lora(model, LoraSettings(rank=2))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == 2 * 7 * 2  # A and B on all 7 linears of 2 layers (all-linear)
    with torch.no_grad():  # B = 0: the adapted model is the base, bit for bit
        assert torch.equal(response_logprobs(model, _batch())[0],
                           response_logprobs(base, _batch())[0])
    for p in lora.trainable(model):
        assert p.dtype == torch.float64  # (autocast_adapter_dtype keeps adapters >= float32)


def test_targets_that_match_nothing_name_the_key_and_the_layers():
    with pytest.raises(ValueError, match=r"model.lora.target_modules=\['qkv'\] matches no "
                                         r"module of LlamaForCausalLM; its decoder's linear "
                                         r"layers are \['down_proj', 'gate_proj', 'k_proj', "
                                         r"'o_proj', 'q_proj', 'up_proj', 'v_proj'\]"):
        lora.apply_lora(_llama(), LoraSettings(target_modules=["qkv"]))


def test_a_reference_copy_to_offload_contradicts_lora(make_cfg):
    with pytest.raises(ValueError, match=r"model.reference_offload: with model.lora the "
                                         r"reference is the policy itself"):
        make_cfg(model={"lora": {"rank": 2}, "reference_offload": True})


@pytest.mark.parametrize("schedule", ["fixed", "every_k", "kl_target"])
def test_references_equal_a_full_copy_on_the_same_weights_and_hold_none(schedule):
    """The reference's log-probs, before and after a refresh, equal those of the held-copy
    implementation on the same weights (float64, exact to rounding); no model is held, and
    a refreshed reference holds only the adapters."""
    policy = _llama()
    lora.apply_lora(policy, LoraSettings(rank=2))
    settings = {"k": 1, "kappa": 1e-9, "kl_ema": 0.0}
    ours = Reference(schedule, policy, adapters=True, **settings)
    copied = Reference(schedule, policy, **settings)  # a deep copy of the initial policy
    assert ours.model is None and ours.held and copied.model is not None
    batch = _batch()

    def both():
        with torch.no_grad():
            with ours.applied(policy):
                a = response_logprobs(policy, batch)[0]
            b = response_logprobs(copied.model, batch)[0]
        return a, b

    _train_adapters(policy, steps=3, seed=1)
    for _ in range(2):  # before any refresh, then after one (fixed: never refreshed)
        a, b = both()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
        ours.after_optimizer_step(), copied.after_optimizer_step()
        ours.after_step(policy, 1.0), copied.after_step(policy, 1.0)
        _train_adapters(policy, steps=2, seed=2)
    assert ours.updates == copied.updates == (0 if schedule == "fixed" else 2)
    held = sum(t.numel() for t in (ours.adapters or {}).values())
    assert held == (0 if schedule == "fixed" else sum(p.numel() for p in lora.trainable(policy)))
    # and the policy itself came back from every reference forward unchanged
    with torch.no_grad():
        assert not torch.equal(response_logprobs(policy, batch)[0], both()[0])


def test_merged_weights_are_peft_merge_under_the_plain_names():
    model = _llama()
    names = list(model.state_dict())
    peft_model = lora.apply_lora(model, LoraSettings(rank=2, alpha=8))
    _train_adapters(model, steps=3, seed=3)
    merged = dict(model_weights(model))
    assert list(merged) == names
    want = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for name, t in want.items():
        torch.testing.assert_close(merged[name], t, atol=1e-12, rtol=0)


def test_lora_trains_every_table3_method_into_plain_checkpoints(make_cfg, tiny_dir):
    """Two steps per method: the base weights never move, the checkpoint loads as a plain
    HF model (no peft) computing the adapted model's log-probs, the adapters beside it load
    with peft onto the base, and save_dtype applies to the merged weights."""
    base = load_file(tiny_dir / "model.safetensors")
    moved = []  # a method whose batches all tie (no advantage, no KL yet) moves nothing
    for method in TABLE3:
        cfg = make_cfg(method, method={"name": method}, model={"lora": {"rank": 2}},
                       optim={"steps": 2, "lr": 1e-2, "mini_batch_size": 8},
                       checkpoint={"eval_steps": [2], "save_dtype": "float32"})
        trainer = Trainer(cfg)
        trainer.setup(track=False)
        for _ in range(2):
            metrics = trainer.step()
            trainer.save()
        assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items()
                   if k.startswith("loss") and v is not None), method
        merged = dict(model_weights(trainer.model))
        moved.append(any(not torch.equal(merged[k], base[k]) for k in base))
        ckpt = trainer.run.checkpoint(2)
        plain = AutoModelForCausalLM.from_pretrained(ckpt).eval()
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir),
                                            ckpt / lora.ADAPTER_DIR).eval()
        batch = _batch_of(trainer)
        with torch.no_grad():
            want = response_logprobs(trainer.model.eval(), batch)[0]
            torch.testing.assert_close(response_logprobs(plain, batch)[0], want, atol=1e-5,
                                       rtol=0)
            torch.testing.assert_close(response_logprobs(adapted, batch)[0], want, atol=1e-5,
                                       rtol=0)
        frozen = [n for n, p in trainer.model.named_parameters() if not p.requires_grad]
        state = dict(trainer.model.named_parameters())
        original = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
        for n in frozen:  # the base never moves (names: peft's base_layer inside)
            assert torch.equal(state[n], original[n.replace(".base_layer", "")]), n
    assert sum(moved) >= 3, moved


def _batch_of(trainer):
    tok = trainer.tokenizer
    ids = tok("What is 2 + 3?")["input_ids"]
    return pack([ids, ids], [[5, 6, 7], [8]], tok.pad_token_id)


def test_bf16_checkpoints_of_merged_weights(make_cfg):
    out = train(make_cfg(model={"lora": {"rank": 2}}, optim={"steps": 1},
                         checkpoint={"save_dtype": "bfloat16"}))
    weights = load_file(out / "checkpoints" / "step_1" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert not any("lora" in k or "base_layer" in k for k in weights)
    config = json.loads((out / "checkpoints" / "step_1" / lora.ADAPTER_DIR /
                         "adapter_config.json").read_text())
    assert config["r"] == 2 and config["peft_type"] == "LORA"


def test_a_resumed_lora_run_equals_an_uninterrupted_one(make_cfg):
    """Adapters, their AdamW state and a refreshed reference's adapters in the resume state:
    every metric and the final weights equal (every_k refreshes each step)."""
    sections = dict(model={"lora": {"rank": 2}}, method={"name": "GRPO", "reference":
                    {"schedule": "every_k", "k": 1}}, optim={"steps": 4, "lr": 1e-2},
                    checkpoint={"eval_steps": [4]})
    whole = train(make_cfg("whole", **sections))
    train(make_cfg("cut", **sections, debug={"stop_after_steps": 2}))
    cut = train(make_cfg("cut", **sections))
    timing = ("time_", "tokens_per_sec")

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(timing)}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert rows(cut) == rows(whole) and rows(whole)[-1]["ref_updates"] == 4
    a = load_file(whole / "checkpoints" / "step_4" / "model.safetensors")
    b = load_file(cut / "checkpoints" / "step_4" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("extra", [{"rollout": {"staleness": 1}},
                                   {"optim": {"optimizer": "schedule_free_adamw"}}],
                         ids=["staleness", "schedule_free"])
def test_staleness_and_schedule_free_train_with_lora(make_cfg, extra):
    sections = {"model": {"lora": {"rank": 2}}, "optim": {"steps": 3, "lr": 1e-2}}
    for key, value in extra.items():
        sections[key] = {**sections.get(key, {}), **value}
    out = train(make_cfg(**sections))
    assert (out / "DONE").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
