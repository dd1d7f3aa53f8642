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


@pytest.mark.parametrize("targets", [["lm_head"], ["embed_tokens"], ["q_proj", "lm_head"]])
def test_targets_outside_the_decoders_linear_layers_are_refused(targets):
    """The chunked head never trains an lm_head adapter, and an embed_tokens adapter
    (peft's lora_embedding_A/B) would be dropped from the merge, adapter/ and the reference
    snapshot: the trainer and the saved checkpoint would differ."""
    model = _llama()
    with pytest.raises(ValueError, match=r"only linear layers inside the decoder's layers "
                                         r"take adapters \(\['down_proj', 'gate_proj'"):
        lora.apply_lora(model, LoraSettings(target_modules=targets))
    assert not lora.lora_layers(model)  # refused before anything was injected
    lora.apply_lora(model, LoraSettings(target_modules=["q_proj", "down_proj"]))
    assert lora.linear_names(model) == ['down_proj', 'gate_proj', 'k_proj', 'o_proj',
                                        'q_proj', 'up_proj', 'v_proj']  # adapted: the same


def test_a_float32_save_over_bf16_weights_keeps_the_adapters_update():
    """Merged in the save dtype: an update below half a bf16 step of W survives a float32
    save (rounded to bf16 first, it was W again)."""
    model = _llama(torch.bfloat16)
    lora.apply_lora(model, LoraSettings(rank=2))
    with torch.no_grad():
        for name, p in lora.adapter_parameters(model).items():
            p.fill_(1e-3 if ".lora_B." in name else 1.0)  # s B A = 16 * 2e-3 = 0.032 / entry
    layer = model.model.layers[0].self_attn.q_proj
    w, delta = layer.base_layer.weight.float(), layer.get_delta_weight("default").float()
    merged32, _ = lora.checkpoint_parts(model, keep=True, dtype=torch.float32)
    merged16, _ = lora.checkpoint_parts(model, keep=True)
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(merged32[name], w + delta, rtol=0, atol=1e-6)
    assert merged32[name].dtype == torch.float32 and merged16[name].dtype == torch.bfloat16
    assert (merged16[name].float() - (w + delta)).abs().max() > 1e-4  # bf16 rounding lost


def test_saving_the_adapters_asks_no_hub(tmp_path, monkeypatch):
    """With model.path a hub id (no local config.json) peft's save_embedding_layers="auto"
    looks the base model up on the Hub: a stall on an offline node. The writer turns it
    off; here any Hub lookup fails the test."""
    import peft.utils.save_and_load as save_and_load

    def offline(*args, **kwargs):
        raise AssertionError(f"the adapter save asked the Hub: {args}")

    monkeypatch.setattr(save_and_load, "check_file_exists_on_hf_hub", offline)
    model = _llama()
    model.config.name_or_path = "some-org/some-model"  # a hub id, as model.path may be
    peft_model = lora.apply_lora(model, LoraSettings(rank=2))
    peft_model.peft_config["default"].base_model_name_or_path = "some-org/some-model"
    _, adapters = lora.checkpoint_parts(model, keep=True)
    lora.adapter_writer(peft_model, adapters)(tmp_path)
    assert (tmp_path / lora.ADAPTER_DIR / "adapter_model.safetensors").is_file()


def test_adapter_contexts_restore_what_they_changed_when_entering_fails(monkeypatch):
    model = _llama()
    lora.apply_lora(model, LoraSettings(rank=2))
    _train_adapters(model, 2, seed=3)
    before = {n: p.detach().clone() for n, p in lora.adapter_parameters(model).items()}
    broken = {n: t for n, t in lora.adapter_snapshot(model).items()}
    broken.pop(next(iter(broken)))  # a snapshot missing one adapter: the copy raises midway
    with pytest.raises(KeyError):
        with lora.adapters_from(model, {n: t * 0 for n, t in broken.items()}):
            pass
    for n, p in lora.adapter_parameters(model).items():
        assert torch.equal(p, before[n]), n  # the ones copied before the failure restored
    layers = lora.lora_layers(model)
    monkeypatch.setattr(type(layers[1]), "enable_adapters", _fail_on_false(type(layers[1])))
    with pytest.raises(RuntimeError):
        with lora.adapters_off(model):
            pass
    assert all(not layer.disable_adapters for layer in layers)  # all on again


def _fail_on_false(cls):
    real = cls.enable_adapters
    calls = []

    def enable(self, enabled):
        calls.append(enabled)
        if enabled is False and len(calls) == 2:  # the second layer refuses to switch off
            raise RuntimeError("cannot disable")
        return real(self, enabled)

    return enable


def test_the_adapters_an_engine_is_served_reconstruct_the_update(tmp_path):
    """rollout.vllm_lora: adapters. The files vLLM loads (peft's format, written without
    peft's wrapper) hold the update exactly, and the base weights it is pushed once are the
    unmerged ones; in bf16 a merged weight keeps little of an early, small update (the
    reason to serve the adapters: perf/lora_push_gap.py measures both at the log-probs)."""
    from peft import LoraConfig

    from common.generation.base import lora_config
    from common.generation.vllm import write_adapter

    model = _llama(torch.bfloat16)
    lora.apply_lora(model, LoraSettings(rank=2))
    _train_adapters(model, 2, seed=4)
    write_adapter(model, tmp_path)
    config = LoraConfig.from_pretrained(str(tmp_path))
    assert (config.r, config.lora_alpha) == (2, 32.0) and lora_config(model).r == 2
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    layer = model.model.layers[1].mlp.down_proj
    prefix = "base_model.model.model.layers.1.mlp.down_proj"
    assert torch.equal(tensors[f"{prefix}.lora_A.weight"], layer.lora_A["default"].weight)
    assert torch.equal(tensors[f"{prefix}.lora_B.weight"], layer.lora_B["default"].weight)
    assert len(tensors) == 2 * 7 * 2
    base = dict(model_weights(model, merge=False))
    assert torch.equal(base["model.layers.1.mlp.down_proj.weight"], layer.base_layer.weight)
    # a small update (B ~ 1e-6, as a run's first steps at lr 1e-5 make it): bf16(W + s B A)
    # keeps little of it, the adapters all of it
    with torch.no_grad():
        b = layer.lora_B["default"].weight
        b.copy_(1e-6 * torch.randn(b.shape, generator=torch.Generator().manual_seed(0)))
    delta = layer.get_delta_weight("default").float()
    merged = dict(model_weights(model))["model.layers.1.mlp.down_proj.weight"].float()
    kept = (merged - layer.base_layer.weight.float()).norm() / delta.norm()
    assert kept < 0.5, float(kept)
