"""The tiny model, its tokenizer and the toy task."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common import toy
from common.grading import grade_many
from common.prompts import build_prompt
from trainer.tiny import TinyConfig, build_model, build_tokenizer


def test_toy_splits_disjoint_deterministic_and_sized():
    train = toy.problems("train", 500, seed=0)
    test = toy.problems("test", 200, seed=0)
    assert toy.problems("test", 200, seed=0) == test
    assert toy.problems("test", 200, seed=1) != test
    assert {p["problem"] for p in train}.isdisjoint({p["problem"] for p in test})
    pool = toy.pool_size("test")
    assert len({p["problem"] for p in toy.problems("test", pool)}) == pool  # n <= pool: distinct
    assert len({p["problem"] for p in test}) == pool  # beyond: the pool cycles
    for p in test[:20]:
        a, b, c = (int(x) for x in p["problem"][len("Compute "):-1].replace("+", "*").split("*"))
        assert p["answer"] == str(a + b * c)


def test_toy_solutions_grade_with_the_shared_dapo_scorer():
    probs = toy.problems("test", 50, seed=0)
    right = grade_many([toy.solution(p["problem"]) for p in probs],
                       [p["answer"] for p in probs], "dapo")
    assert all(r.correct for r in right)
    # The format slip holds the right number but no answer line: never gradable.
    wrong = grade_many([toy.wrong_solution(p["problem"]) for p in probs],
                       [p["answer"] for p in probs], "dapo")
    assert all(not r.correct and r.status == "no_answer" for r in wrong)
    assert all(p["answer"] in toy.wrong_solution(p["problem"]) for p in probs)


def test_tokenizer_keeps_the_dapo_prompt_short_and_roundtrips():
    tok = build_tokenizer(TinyConfig())
    prompt = build_prompt("Compute 12 + 3 * 4.", "dapo", tok)
    assert prompt.startswith("<|user|>\n") and prompt.endswith("<|assistant|>\n")
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) < 80  # word-level merges: the ~45-word instruction is ~60 tokens
    assert tok.decode(ids) == prompt
    response = toy.solution("Compute 12 + 3 * 4.")
    r_ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(r_ids, skip_special_tokens=True) == response
    digits = [t for t in tok.convert_ids_to_tokens(r_ids) if t.strip("Ġ").isdigit()]
    assert all(len(t.strip("Ġ")) == 1 for t in digits)  # one digit per token


def test_saved_tiny_model_loads_like_a_hub_model(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert tok.eos_token == "<|eos|>" and tok.pad_token == "<|pad|>" and tok.chat_template
    assert (tiny_dir / "model.safetensors").exists()
    n = sum(p.numel() for p in model.parameters())
    assert 10_000 < n < 5_000_000
    default = build_model(TinyConfig(), build_tokenizer(TinyConfig()))
    assert 100_000 < sum(p.numel() for p in default.parameters()) < 5_000_000


def test_build_is_deterministic_for_a_seed():
    cfg = TinyConfig(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)
    tok = build_tokenizer(cfg)
    a, b = build_model(cfg, tok), build_model(cfg, tok)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = build_model(cfg.model_copy(update={"seed": 1}), tok)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
