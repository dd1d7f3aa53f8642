"""The `hf` generation engine (common.generation) on the tiny checkpoint; the `vllm` engine is
tested for real in tests/vllm/."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.generation import ENGINES, EngineOptions, Sample, check_checkpoint, start_engine
from common.generation.hf import (
    HFEngine,
    checkpoint_defaults_ignored,
    hf_generate,
    sampling_generation_config,
)
from common.prompts import adds_special_tokens, build_prompt, encode_prompts, render


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


def test_one_tokenization_rule(tiny_checkpoint):
    """Chat-formatted text already carries its special tokens: no second BOS; without a chat
    template the tokenizer's default applies."""
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    chat = build_prompt("What is 3?", "dapo", tok)
    assert not adds_special_tokens(tok)
    assert encode_prompts(tok, [chat]) == [tok(chat, add_special_tokens=False)["input_ids"]]
    tok.chat_template = None
    assert adds_special_tokens(tok)
    assert encode_prompts(tok, ["x"]) == [tok("x")["input_ids"]]


def test_hf_engine_and_registry(tiny_checkpoint):
    engine = start_engine("hf", tiny_checkpoint, EngineOptions(device="cpu"))
    assert isinstance(engine, HFEngine) and ENGINES.get("hf") is HFEngine
    out = engine.generate(["x"], n=2, temperature=1.0, top_p=0.9, max_new_tokens=3, seed=0)
    assert len(out) == 1 and len(out[0]) == 2
    with pytest.raises(ValueError, match="engine='jax' is not registered"):
        start_engine("jax", tiny_checkpoint, EngineOptions())


def test_hf_engine_load_weights_swaps_and_checks(tiny_checkpoint, tmp_path):
    """Weights loaded from another checkpoint give that checkpoint's samples; a partial or
    foreign set of weights is refused."""
    other = tmp_path / "other"
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(other)
    kw = {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8, "seed": 3}
    opts = EngineOptions(device="cpu")
    fresh = start_engine("hf", other, opts).generate(["Compute 1 + 2."], **kw)
    engine = start_engine("hf", tiny_checkpoint, opts)
    before = engine.generate(["Compute 1 + 2."], **kw)
    engine.load_checkpoint(other)
    assert engine.generate(["Compute 1 + 2."], **kw) == fresh != before
    state = dict(model.state_dict())
    state.pop("model.norm.weight")
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.load_weights(state.items())
    with pytest.raises(ValueError, match="not in the LlamaForCausalLM state dict"):
        engine.load_weights([("no.such.weight", torch.zeros(1))])


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


# ---- the exact sampling distribution (checkpoint sampling defaults ignored) ----


@pytest.fixture(scope="module")
def opinionated_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint with a peaked head (the top 3 tokens hold roughly half the mass)
    and a generation_config.json full of sampling defaults a hub model might carry."""
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    gc = model.generation_config
    gc.do_sample, gc.top_k, gc.top_p, gc.temperature = True, 3, 0.5, 0.3
    gc.repetition_penalty, gc.min_p, gc.no_repeat_ngram_size = 1.5, 0.2, 1
    out = tmp_path_factory.mktemp("opinionated") / "ckpt"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(out)
    assert '"top_k": 3' in (out / "generation_config.json").read_text()
    return out


def _scores_and_logits(model, tok, prompt, temperature, ignore_defaults: bool):
    """Per generated position: the scores `generate` samples from and the raw logits."""
    config = sampling_generation_config(model, tok, temperature=temperature, top_p=1.0,
                                        max_new_tokens=6)
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        if ignore_defaults:
            with checkpoint_defaults_ignored(model):
                out = model.generate(**enc, generation_config=config, output_scores=True,
                                     output_logits=True, return_dict_in_generate=True)
        else:
            out = model.generate(**enc, generation_config=config, output_scores=True,
                                 output_logits=True, return_dict_in_generate=True)
    return torch.stack(out.scores), torch.stack(out.logits)  # (T, 1, V) each


def test_generate_samples_from_the_full_softmax_exactly(opinionated_checkpoint):
    """The probabilities `generate` samples from (its processed scores) are exactly
    softmax(logits / temperature): no top_k, repetition penalty, min_p or n-gram ban."""
    model = AutoModelForCausalLM.from_pretrained(opinionated_checkpoint)
    tok = AutoTokenizer.from_pretrained(opinionated_checkpoint)
    prompt = build_prompt("Compute 1 + 2.", "dapo", tok)
    for temperature in (1.0, 0.7):
        scores, logits = _scores_and_logits(model, tok, prompt, temperature, True)
        torch.testing.assert_close(torch.log_softmax(scores, -1),
                                   torch.log_softmax(logits / temperature, -1))
    # Control: the checkpoint's defaults would change the distribution if let through.
    scores, logits = _scores_and_logits(model, tok, prompt, 1.0, False)
    assert torch.isinf(scores).sum() > 0  # top_k / min_p cut tokens to -inf
    assert model.generation_config.top_k == 3  # restored after generate


def test_hf_generate_hits_tokens_outside_the_top_k_at_the_softmax_rate(opinionated_checkpoint):
    """Statistical check through hf_generate itself: N first tokens drawn at temperature 1;
    the count outside the checkpoint's top 3 is Binomial(N, p_out) with p_out from the full
    softmax. Fixed seed; the bound (5 sigma) fails a correct sampler with prob. < 1e-6, and
    top_k=3 (count 0) fails it by ~45 sigma."""
    model = AutoModelForCausalLM.from_pretrained(opinionated_checkpoint)
    tok = AutoTokenizer.from_pretrained(opinionated_checkpoint)
    prompt = build_prompt("Compute 1 + 2.", "dapo", tok)
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[0, -1].double(), -1)  # (V,)
    top3 = set(probs.topk(3).indices.tolist())
    p_out = 1.0 - probs[list(top3)].sum().item()
    assert 0.2 < p_out < 0.8  # a peaked head: the test has power both ways
    n = 2000
    samples = hf_generate(model, tok, [prompt], n=n, temperature=1.0, top_p=1.0,
                          max_new_tokens=1, seed=0, batch_size=500)[0]
    outside = sum(s.token_ids[0] not in top3 for s in samples)
    sigma = (n * p_out * (1 - p_out)) ** 0.5
    assert abs(outside - n * p_out) <= 5 * sigma, (outside, n * p_out, sigma)


def test_a_new_engine_is_one_registered_class(tiny_checkpoint, tmp_path):
    """The recipe in docs/evaluation.md: subclass Engine, set `name`, register it; the
    evaluation then runs on it by name (here a greedy-only engine built on transformers)."""
    from common.generation import Engine, register_engine
    from eval.run import EvalConfig, evaluate

    @register_engine
    class GreedyOnly(Engine):
        name = "greedy-only"

        def __init__(self, inner):
            self.inner, self.tokenizer = inner, inner.tokenizer

        @classmethod
        def from_checkpoint(cls, path, options):
            return cls(HFEngine.from_checkpoint(path, options))

        def generate(self, prompts, *, n, temperature, top_p, max_new_tokens, seed):
            return self.inner.generate(prompts, n=n, temperature=0.0, top_p=top_p,
                                       max_new_tokens=max_new_tokens, seed=seed)

        def load_weights(self, weights):
            self.inner.load_weights(weights)

    try:
        cfg = EvalConfig(checkpoint=str(tiny_checkpoint), benchmark="toy", limit=2, n=2,
                         max_new_tokens=4, backend="greedy-only", device="cpu",
                         out=str(tmp_path), progress=False)
        summary = evaluate(cfg)
        assert summary["sampling"]["backend"] == "greedy-only"
        rows = [json.loads(x) for x in (tmp_path / "toy.jsonl").read_text().splitlines()]
        assert rows[0]["completion"] == rows[1]["completion"]  # greedy: both samples agree
        # Without its own for_rollout, a training run starts it on the run's checkpoint in
        # the training model's dtype (then pushes the model's weights in).
        model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).to(torch.float64)
        rollout = GreedyOnly.for_rollout(SimpleNamespace(gen_batch_size=8), model, None,
                                         model_path=str(tiny_checkpoint), seed=0)
        assert isinstance(rollout, GreedyOnly) and rollout.inner.batch_size == 8
        assert rollout.inner.model.dtype == torch.float64
    finally:
        del ENGINES["greedy-only"]
    with pytest.raises(ValueError, match=r"backend\s+Value error, engine='greedy-only' is not "
                       r"registered; choose one of \['hf', 'vllm'\]"):
        EvalConfig(checkpoint="c", benchmark="toy", out="o", backend="greedy-only")


SHIPPED_TINY = Path(__file__).resolve().parents[2] / "data" / "tiny-model"


def _generate_reference(model, tok, prompts, *, n, temperature, top_p, max_new_tokens, seed,
                        batch_size):
    """What hf_generate returned when it called `model.generate` on every row: the token
    ids per row, rows prompt-major, `batch_size` rows per call, one seeded RNG stream."""
    config = sampling_generation_config(model, tok, temperature=temperature, top_p=top_p,
                                        max_new_tokens=max_new_tokens)
    ends = set(config.eos_token_id)
    rows = [p for p in prompts for _ in range(n)]
    old_side, tok.padding_side = tok.padding_side, "left"
    out = []
    try:
        with torch.random.fork_rng(), torch.no_grad(), checkpoint_defaults_ignored(model):
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                enc = tok(rows[start : start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=adds_special_tokens(tok))
                generated = model.generate(**enc, generation_config=config)
                for row in generated[:, enc["input_ids"].shape[1] :].tolist():
                    stop = next((i for i, t in enumerate(row) if t in ends), None)
                    out.append(row if stop is None else row[: stop + 1])
    finally:
        tok.padding_side = old_side
    return out


@pytest.mark.parametrize("n,temperature,top_p,batch_size", [
    (8, 1.0, 1.0, 256),  # the default's rollouts: one call, 8 copies of each prompt
    (4, 1.0, 1.0, 6),  # the default's evaluation; calls that cut a prompt's copies apart
    (3, 0.7, 0.9, 5),  # both warpers
    (2, 0.0, 1.0, 64),  # greedy
])
def test_hf_generate_draws_exactly_what_generate_draws(n, temperature, top_p, batch_size):
    """Speed without a change of numbers: hf_generate prefills each distinct prompt once and
    decodes itself, and gives, token for token, what transformers `generate` gives on every
    row with the same seed (shipped warm-start model: responses end at EOS at varied steps,
    so finished rows, padding and the early stop are exercised)."""
    from common.toy import problems as toy_problems

    model = AutoModelForCausalLM.from_pretrained(SHIPPED_TINY)
    tok = AutoTokenizer.from_pretrained(SHIPPED_TINY)
    prompts = [build_prompt(p["problem"], "dapo", tok) for p in toy_problems("train", 5, seed=3)]
    prompts[2] = build_prompt("What is 3?", "boxed", tok)  # another length: left padding
    kw = {"n": n, "temperature": temperature, "top_p": top_p, "max_new_tokens": 20,
          "batch_size": batch_size, "seed": 1}
    ours = hf_generate(model, tok, prompts, **kw)
    reference = _generate_reference(model, tok, prompts, **kw)
    assert [s.token_ids for group in ours for s in group] == reference
    lengths = {len(ids) for ids in reference}
    assert len(lengths) > 1  # rows finished at different steps


def test_the_prefill_computes_the_head_at_the_last_position_only(model_and_tok, monkeypatch):
    """As generate does: `logits_to_keep=1` on the prefill, so no (U, L, V) logits are
    built (about 6 GB at a 152k vocabulary); decoding feeds one token a step anyway."""
    model, tok = model_and_tok
    shapes, forward = [], type(model).forward

    @functools.wraps(forward)  # the signature the engine inspects stays the model's
    def recording(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        shapes.append((kwargs.get("logits_to_keep"), tuple(out.logits.shape)))
        return out

    monkeypatch.setattr(type(model), "forward", recording)
    hf_generate(model, tok, _prompts(tok), n=2, temperature=1.0, top_p=1.0,
                max_new_tokens=3, seed=0)
    (keep, prefill), *decoding = shapes
    assert keep == 1 and prefill[1] == 1  # (U, 1, V), not (U, L, V)
    assert all(shape[1] == 1 for _, shape in decoding)
