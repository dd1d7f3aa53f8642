"""KL to the initial model (eval/kl.py): the estimators by hand and by exact enumeration in
float64, the teacher-forced log-probs against a prefix-by-prefix forward, and the evaluation
hook end to end (summary block, MLflow keys, the skip and error cases)."""

from __future__ import annotations

import itertools
import json
import math
import shutil

import numpy as np
import pytest
import torch
import yaml
from _eval_tiny import build_tiny_checkpoint
from transformers import LlamaConfig, LlamaForCausalLM

from common.layout import CHECKPOINT_CONFIG
from eval import kl
from eval.__main__ import main
from eval.run import EvalConfig, evaluate, log_to_mlflow, prepare, summary_metrics

# ---------------------------------------------------------------------------------------
# The estimators by hand
# ---------------------------------------------------------------------------------------


def test_k1_and_k3_by_hand():
    # d = (log 2, -log 2): k1 = 0; k3 = (1/2 - 1 + log 2) + (2 - 1 - log 2) = 1/2
    d = np.array([math.log(2.0), -math.log(2.0)])
    assert kl.k1(d) == pytest.approx(0.0, abs=1e-15)
    assert kl.k3(d) == pytest.approx(0.5, abs=1e-15)
    # one token with d = log 3: k3 = 1/3 - 1 + log 3
    assert kl.k3(np.array([math.log(3.0)])) == pytest.approx(1 / 3 - 1 + math.log(3.0), abs=1e-15)


def test_kl_summary_means_and_stderr_by_hand():
    # two problems x two samples, one token each: k1 values 1, 3 | 0, 0
    per_problem = [[np.array([1.0]), np.array([3.0])], [np.array([0.0]), np.array([0.0])]]
    out = kl.kl_summary(per_problem)
    assert out["kl_to_initial_k1"] == pytest.approx(1.0)
    # per-problem means 2 and 0: std (ddof 1) sqrt(2), over sqrt(2) problems -> 1
    assert out["kl_to_initial_k1_stderr"] == pytest.approx(1.0)
    k3s = [math.exp(-1) - 1 + 1, math.exp(-3) - 1 + 3, 0.0, 0.0]
    assert out["kl_to_initial_k3"] == pytest.approx(sum(k3s) / 4)


# ---------------------------------------------------------------------------------------
# Exact enumeration on a tiny vocabulary (float64)
# ---------------------------------------------------------------------------------------

V, EOS, L = 4, 3, 3  # vocabulary, end-of-sequence id, max_new_tokens
PROMPT = [0, 1]


def _tiny_lm(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                         eos_token_id=EOS, pad_token_id=0, bos_token_id=0)
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():  # random logits big enough that the two models differ clearly
        model.lm_head.weight.mul_(40.0)
    return model


def _responses() -> list[list[int]]:
    """Every response the sampler can return: up to and including the first EOS, or L
    tokens without one."""
    out = []
    for length in range(1, L + 1):
        for ys in itertools.product(range(V), repeat=length):
            ends = [i for i, y in enumerate(ys) if y == EOS]
            if (ends and ends[0] == length - 1) or (not ends and length == L):
                out.append(list(ys))
    return out


def _next_token_dist(model, prefix: list[int], temperature: float) -> np.ndarray:
    """softmax(logits / T) of the next token after `prefix`, from an unpadded forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix])).logits[0, -1]
    return torch.softmax(logits / temperature, dim=-1).numpy()


def _chain_rule_kl(p_model, q_model, temperature: float) -> float:
    """KL(p || q) over responses by the chain rule: sum over unfinished prefixes of
    P(prefix) * KL of the next-token distributions. Independent of the sampled-sequence
    computation the estimator uses."""
    total, frontier = 0.0, [([], 1.0)]
    for _ in range(L):
        nxt = []
        for prefix, prob in frontier:
            p = _next_token_dist(p_model, PROMPT + prefix, temperature)
            q = _next_token_dist(q_model, PROMPT + prefix, temperature)
            total += prob * float(np.sum(p * (np.log(p) - np.log(q))))
            nxt += [(prefix + [v], prob * p[v]) for v in range(V) if v != EOS]
        frontier = nxt
    return total


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_estimators_are_unbiased_by_exact_enumeration(temperature):
    ckpt, init = _tiny_lm(0), _tiny_lm(1)
    responses = _responses()
    prompts = [PROMPT] * len(responses)
    lp = kl.response_logprobs(ckpt, prompts, responses, temperature=temperature, batch_size=7)
    lq = kl.response_logprobs(init, prompts, responses, temperature=temperature, batch_size=5)
    prob = np.exp([a.sum() for a in lp])  # q_ckpt(y): the sampler's probability of y
    assert prob.sum() == pytest.approx(1.0, abs=1e-12)  # the enumeration is complete
    exact = _chain_rule_kl(ckpt, init, temperature)
    assert exact > 0.05  # the two models differ: the check below is not 0 == 0
    expect_k1 = float(np.sum(prob * [kl.k1(a - b) for a, b in zip(lp, lq)]))
    expect_k3 = float(np.sum(prob * [kl.k3(a - b) for a, b in zip(lp, lq)]))
    assert expect_k1 == pytest.approx(exact, rel=1e-10, abs=1e-12)
    assert expect_k3 == pytest.approx(exact, rel=1e-10, abs=1e-12)


def test_response_logprobs_match_an_unpadded_prefix_by_prefix_forward():
    model = _tiny_lm(2)
    prompts = [[0, 1], [2], [1, 2, 0]]
    responses = [[2, 3], [0, 1, 1, 3], [3]]
    got = kl.response_logprobs(model, prompts, responses, batch_size=3)
    for p, r, g in zip(prompts, responses, got):
        want = [math.log(_next_token_dist(model, p + r[:j], 1.0)[r[j]]) for j in range(len(r))]
        np.testing.assert_allclose(g, want, rtol=0, atol=1e-12)


def test_rows_sharing_a_prompt_get_each_their_own_responses_log_probs():
    """A problem's samples share one pass over their prompt (its KV cache copied to each
    row): still every row's exact prefix-by-prefix log-probs, whatever the batch split, the
    prompts' lengths, or an empty response beside long ones."""
    model = _tiny_lm(2)
    prompts = [[0, 1], [0, 1], [0, 1], [2], [1, 2, 0], [1, 2, 0], [2]]
    responses = [[2, 3], [1], [], [0, 1, 1, 3], [3], [0, 0, 2], [1, 3]]
    for batch_size in (2, 3, 7):
        got = kl.response_logprobs(model, prompts, responses, batch_size=batch_size)
        assert [len(g) for g in got] == [len(r) for r in responses]
        for p, r, g in zip(prompts, responses, got):
            want = [math.log(_next_token_dist(model, p + r[:j], 1.0)[r[j]])
                    for j in range(len(r))]
            np.testing.assert_allclose(g, want, rtol=0, atol=1e-12)


def test_the_samples_settings_decide_whether_a_kl_is_estimated():
    assert kl.skip_reason(1.0, 1.0) is None and kl.skip_reason(0.6, 1.0) is None
    assert "top_p=0.95" in kl.skip_reason(1.0, 0.95)
    assert "greedy" in kl.skip_reason(0.0, 1.0)
    with pytest.raises(ValueError, match="temperature > 0"):
        kl.response_logprobs(_tiny_lm(0), [[0]], [[1]], temperature=0.0)


# ---------------------------------------------------------------------------------------
# The evaluation hook, end to end on the tiny checkpoint
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An initial model and a trained checkpoint (other weights, same tokenizer), and a
    checkpoint holding the initial model's own weights; each names the initial model in its
    run config as the trainer's checkpoints do."""
    root = tmp_path_factory.mktemp("kl")
    initial = build_tiny_checkpoint(root / "model", seed=0)
    trained = build_tiny_checkpoint(root / "run" / "checkpoints" / "step_5", seed=1)
    same = root / "same" / "checkpoints" / "step_5"
    shutil.copytree(initial, same)
    for ckpt in (trained, same):
        (ckpt / CHECKPOINT_CONFIG).write_text(yaml.safe_dump({"model": {"path": str(initial)}}))
    return initial, trained, same


def _cfg(ckpt, out, benchmark_dir, **kw) -> EvalConfig:
    base = dict(checkpoint=str(ckpt), benchmark="aime24", out=str(out), n=3, max_new_tokens=6,
                benchmark_file=str(benchmark_dir / "aime24.jsonl"), limit=3, batch_size=4,
                scorers=("dapo",), progress=False)
    return EvalConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained_eval(models, benchmark_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained_eval")
    return out, evaluate(_cfg(models[1], out, benchmark_dir))


def test_summary_carries_the_kl_of_a_trained_checkpoint(models, trained_eval):
    initial = models[0]
    tmp_path, summary = trained_eval
    block = summary["kl_to_initial"]
    assert block["reference"] == str(initial) and len(block["reference_sha256"]) == 64
    assert block["temperature"] == 1.0 and block["top_p"] == 1.0 and block["num_samples"] == 9
    # k1 can be negative on a few samples (an unbiased estimate, not a bound); k3 cannot
    assert math.isfinite(block["kl_to_initial_k1"]) and block["kl_to_initial_k3"] > 0
    assert block["kl_to_initial_k1_stderr"] > 0
    on_disk = json.loads((tmp_path / "aime24.json").read_text())
    assert on_disk["kl_to_initial"] == block
    metrics = summary_metrics(summary)
    for key in kl.KEYS:
        assert metrics[f"eval/aime24/{key}"] == block[key]


def test_mlflow_gets_the_kl_at_the_checkpoints_step(trained_eval, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("kl")).info.run_id
    summary = trained_eval[1]
    assert summary["step"] == 5 and log_to_mlflow(summary, uri, run_id)
    for key in ("kl_to_initial_k1", "kl_to_initial_k3"):
        hist = client.get_metric_history(run_id, f"eval/aime24/{key}")
        assert [(m.step, m.value) for m in hist] == [(5, summary["kl_to_initial"][key])]


def test_a_checkpoint_equal_to_its_initial_model_paid_no_kl(models, benchmark_dir, tmp_path):
    _, _, same = models
    block = evaluate(_cfg(same, tmp_path, benchmark_dir))["kl_to_initial"]
    assert block["kl_to_initial_k1"] == 0.0 and block["kl_to_initial_k3"] == 0.0


def test_no_kl_without_an_initial_model_or_when_turned_off(models, benchmark_dir, tmp_path,
                                                           tiny_checkpoint):
    _, trained, _ = models
    assert "kl_to_initial" not in evaluate(_cfg(tiny_checkpoint, tmp_path / "a", benchmark_dir))
    args = ["--checkpoint", str(trained), "--benchmark", "aime24", "--benchmark-file",
            str(benchmark_dir / "aime24.jsonl"), "--limit", "2", "--n", "2",
            "--max-new-tokens", "4", "--scorers", "dapo", "--out", str(tmp_path / "b"),
            "--no-progress", "--no-kl"]
    assert main(args) == 0
    off = json.loads((tmp_path / "b" / "aime24.json").read_text())
    assert "kl_to_initial" not in off
    assert not any("kl_to_initial" in k for k in summary_metrics(off))


def test_nucleus_sampling_records_why_no_kl(models, benchmark_dir, tmp_path):
    _, trained, _ = models
    block = evaluate(_cfg(trained, tmp_path, benchmark_dir, top_p=0.9))["kl_to_initial"]
    assert "top_p=0.9" in block["skipped"] and "kl_to_initial_k1" not in block


def test_a_missing_initial_model_fails_before_sampling(models, benchmark_dir, tmp_path):
    _, trained, _ = models
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    shutil.copytree(trained, ckpt)
    gone = tmp_path / "results" / "model"
    (ckpt / CHECKPOINT_CONFIG).write_text(yaml.safe_dump({"model": {"path": str(gone)}}))
    with pytest.raises(ValueError, match=r"model\.path=.*is not a directory"):
        prepare(_cfg(ckpt, tmp_path / "out", benchmark_dir))
