"""Sampler tests on the tiny checkpoint; vLLM (not installable here) via a stand-in module."""

from __future__ import annotations

import shutil
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eval.prompts import build_prompt, render
from eval.samplers import (
    HFSampler,
    Sample,
    VLLMSampler,
    check_checkpoint,
    get_sampler,
    hf_generate,
    vllm_sampling_params,
)


@pytest.fixture(scope="module")
def model_and_tok(tiny_checkpoint):
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    return model, tok


def _prompts(tok):
    return [build_prompt("Compute 1 + 2.", "dapo", tok), build_prompt("What is 3?", "boxed", tok)]


def test_hf_generate_shapes_determinism_and_rng(model_and_tok):
    model, tok = model_and_tok
    kw = {"n": 3, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12}
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    side = tok.padding_side
    a = hf_generate(model, tok, _prompts(tok), seed=0, batch_size=4, **kw)
    assert torch.equal(before, torch.random.get_rng_state())  # caller's RNG untouched
    assert len(a) == 2 and all(len(per) == 3 for per in a)
    for s in (s for per in a for s in per):
        assert isinstance(s, Sample) and s.finish_reason in ("stop", "length")
        assert 1 <= len(s.token_ids) <= 12
        assert tok.pad_token_id not in s.token_ids or tok.pad_token_id == tok.eos_token_id
        assert s.text == tok.decode(s.token_ids, skip_special_tokens=True)
    assert hf_generate(model, tok, _prompts(tok), seed=0, batch_size=4, **kw) == a
    assert hf_generate(model, tok, _prompts(tok), seed=1, batch_size=4, **kw) != a
    assert tok.padding_side == side  # left padding only inside hf_generate


def test_hf_generate_stop_reason_and_eos_kept(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(tok)[:1]
    kw = {"n": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0}
    first = hf_generate(model, tok, prompts, max_new_tokens=1, **kw)[0][0].token_ids[0]
    old = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, first]  # greedy stops at once
    try:
        s = hf_generate(model, tok, prompts, max_new_tokens=8, **kw)[0][0]
    finally:
        model.generation_config.eos_token_id = old
    assert s.finish_reason == "stop" and s.token_ids == [first]
    long = hf_generate(model, tok, prompts, max_new_tokens=5, **kw)[0][0]
    assert long.finish_reason == "length" and len(long.token_ids) == 5


def test_hf_generate_validates_before_work(model_and_tok):
    model, tok = model_and_tok
    base = {"n": 1, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "seed": 0}
    for key, bad, msg in [
        ("n", 0, "n=0"),
        ("temperature", -1.0, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("max_new_tokens", 0, "max_new_tokens"),
    ]:
        with pytest.raises(ValueError, match=msg):
            hf_generate(model, tok, ["x"], **{**base, key: bad})


def test_chat_template_and_raw_prompts(tiny_checkpoint):
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    chat = build_prompt("What is 3?", "dapo", tok)
    assert chat.startswith("<s><|user|>\n") and chat.endswith("<|assistant|>\n")
    tok.chat_template = None
    assert build_prompt("What is 3?", "dapo", tok) == render("What is 3?", "dapo")


def test_hf_sampler_and_registry(tiny_checkpoint):
    sampler = get_sampler("hf", tiny_checkpoint, device="cpu")
    assert isinstance(sampler, HFSampler)
    out = sampler.sample(["x"], n=2, temperature=1.0, top_p=0.9, max_new_tokens=3, seed=0)
    assert len(out) == 1 and len(out[0]) == 2
    with pytest.raises(ValueError, match="backend='jax' is not registered"):
        get_sampler("jax", tiny_checkpoint)


def test_check_checkpoint_errors(tmp_path, tiny_checkpoint):
    with pytest.raises(FileNotFoundError):
        check_checkpoint(tmp_path / "nope")
    with pytest.raises(ValueError, match="no config.json"):
        check_checkpoint(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_checkpoint / f, bare / f)
    with pytest.raises(ValueError, match="has no tokenizer"):
        check_checkpoint(bare)


# ---- vLLM stand-in: records what our code passes to the real API surface ----


@dataclass
class _Completion:
    token_ids: list
    text: str
    finish_reason: str


@dataclass
class _Request:
    outputs: list


def _fake_vllm(finish="stop"):
    mod = types.ModuleType("vllm")
    calls = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            calls["params"] = kwargs
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def generate(self, prompts, params, use_tqdm=False):
            calls["prompts"] = prompts
            n = params.kwargs["n"]
            return [
                _Request([_Completion([5, 6, 2], f"Answer: {i}", finish) for _ in range(n)])
                for i, _ in enumerate(prompts)
            ]

    mod.SamplingParams, mod.LLM = SamplingParams, LLM
    return mod, calls


def test_vllm_sampling_params_are_explicit(monkeypatch):
    mod, calls = _fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", mod)
    vllm_sampling_params(n=32, temperature=1.0, top_p=0.7, max_new_tokens=8192, seed=3)
    assert calls["params"] == {
        "n": 32,
        "temperature": 1.0,
        "top_p": 0.7,
        "max_tokens": 8192,
        "seed": 3,
        "skip_special_tokens": True,
    }
    with pytest.raises(ValueError, match="max_new_tokens"):
        vllm_sampling_params(n=1, temperature=1.0, top_p=1.0, max_new_tokens=0, seed=0)


def test_vllm_sampler_maps_outputs(monkeypatch, tiny_checkpoint):
    mod, calls = _fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", mod)
    sampler = get_sampler("vllm", tiny_checkpoint, seed=0)
    assert isinstance(sampler, VLLMSampler) and calls["llm"]["model"] == str(tiny_checkpoint)
    prompt = build_prompt("What is 3?", "dapo", sampler.tokenizer)
    out = sampler.sample(
        [prompt, prompt], n=2, temperature=1.0, top_p=1.0, max_new_tokens=9, seed=0
    )
    assert out[1][0] == Sample([5, 6, 2], "Answer: 1", "stop") and len(out[0]) == 2
    ids = calls["prompts"][0]["prompt_token_ids"]
    # chat-formatted text already has BOS: tokenized without adding a second one
    assert ids == sampler.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(sampler.tokenizer.bos_token_id) == 1
    mod2, _ = _fake_vllm(finish="abort")
    monkeypatch.setitem(sys.modules, "vllm", mod2)
    aborted = VLLMSampler(tiny_checkpoint)
    with pytest.raises(RuntimeError, match="finish_reason='abort'"):
        aborted.sample(["x"], n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0)
