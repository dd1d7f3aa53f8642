"""Stale rollouts (`rollout.staleness: k`, trainer.staleness): step t's batch is sampled, and
its behaviour log-probs recomputed, by the weights step t-k started from; the first k+1 steps
by the initial weights; k = 0 is today's loop bit for bit; resume restores the lag."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.generation.hf import HFEngine
from trainer.logprobs import PolicyLogProbs
from trainer.loop import Trainer, train
from trainer.rollout import RolloutEngine
from trainer.staleness import WeightLag, check_resume, cpu_snapshot


def untimed(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "tokens_per_sec"}
            for r in rows]


SMALL = {"prompts_per_step": 2, "max_new_tokens": 12}  # rollouts cheap enough for many steps


def final_weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_copy_lags_k_pushes_and_starts_at_the_initial_weights(k):
    """The decision of what the engine gets when: after push t (theta_t) the generation copy
    holds theta_{max(t-k, 0)}; push returns what became due, None in the first k pushes."""
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)  # theta_0
    lag = WeightLag(model, k)
    for t in range(1, 7):
        with torch.no_grad():
            model.weight.fill_(float(t))  # step t's update -> theta_t
        due = lag.push(model)
        expected = max(t - k, 0)
        assert (due is None) == (t <= k)
        if due is not None:
            assert torch.equal(due["weight"], torch.full((1, 2), float(expected)))
        assert torch.equal(lag.model.weight, torch.full((1, 2), float(expected)))
        assert len(lag.pending) == min(t, k) and not lag.model.weight.requires_grad
    # The resume state round-trips through templates of the saved shape.
    fresh = WeightLag(torch.nn.Linear(2, 1), k)
    state = fresh.templates(lag.counters()["pending"])
    for part, src in (("generator", lag.state_dict()["generator"]),
                      *((("pending", i), s) for i, s in lag.state_dict()["pending"].items())):
        target = state[part] if isinstance(part, str) else state[part[0]][part[1]]
        for name, tensor in src.items():
            target[name].copy_(tensor)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.model.weight, lag.model.weight)
    assert [s["weight"][0, 0].item() for s in fresh.pending] == \
        [s["weight"][0, 0].item() for s in lag.pending]


def test_refusals_name_the_key():
    with pytest.raises(ValueError, match=r"rollout.staleness=1 but the resume state was saved "
                                         r"with staleness 2: set rollout.staleness: 2"):
        check_resume({"k": 2, "pending": 2}, 1)
    with pytest.raises(ValueError, match=r"rollout.staleness=1 .* saved with staleness 0"):
        check_resume(None, 1)
    check_resume(None, 0)


def test_staleness_zero_is_todays_run_bit_for_bit_without_a_copy(make_cfg):
    common = {"optim": {"steps": 2, "epochs": 2, "mini_batch_size": 4}}
    today = train(make_cfg("today", rollout=SMALL, **common))
    zero = train(make_cfg("zero", rollout={**SMALL, "staleness": 0}, **common))
    assert untimed(zero) == untimed(today)
    for name, tensor in final_weights(today, 2).items():
        assert torch.equal(final_weights(zero, 2)[name], tensor), name
    trainer = Trainer(make_cfg("parts", rollout={"staleness": 0}))
    trainer.setup(track=False)
    assert trainer.lag is None and trainer.sampling_model is trainer.model
    assert trainer.behaviour_policy is trainer.policy  # no second model, no recompute


def record_updates(trainer: Trainer) -> list:
    """Each step's batch and the behaviour log-probs the update was given, as it runs."""
    seen, update = [], trainer.updater.update

    def recording(batch, old_logp, ref_logp, advantages, mu_logp=None):
        seen.append((batch, old_logp.clone()))
        return update(batch, old_logp, ref_logp, advantages, mu_logp)

    trainer.updater.update = recording
    return seen


def logprobs_with(trainer: Trainer, weights: dict, batch) -> torch.Tensor:
    model = copy.deepcopy(trainer.model)
    model.load_state_dict(weights)
    return trainer.updater.logprobs_no_grad(PolicyLogProbs(model), batch, False)[0]


@pytest.mark.parametrize(("k", "own_weights"), [(1, False), (2, True)])
def test_rollouts_sample_from_the_weights_k_steps_back(make_cfg, k, own_weights):
    """Each step's behaviour log-probs equal those recomputed with a saved copy of the
    weights step t-k started from (the initial ones while t <= k+1) and differ from the
    current weights'; regenerating with that copy and the step's seed gives the very same
    samples. own_weights: the engine holds its own copy, as vLLM does, and receives the
    lagged weights pushed after each update (the hf engine samples the lag's copy itself)."""
    steps = k + 2  # k+1 steps from the initial weights, then one from theta_1
    trainer = Trainer(make_cfg(f"k{k}", rollout={**SMALL, "staleness": k},
                               optim={"steps": steps, "lr": 1e-2}))
    trainer.setup(track=False)
    seen = record_updates(trainer)
    if own_weights:
        trainer.engine.engine = HFEngine(copy.deepcopy(trainer.model), trainer.tokenizer,
                                         batch_size=trainer.cfg.rollout.gen_batch_size)
    generated = []  # per step: (prompts, seed, samples)
    generate = trainer.engine.generate

    def recording_generate(prompts, *, n, seed):
        out = generate(prompts, n=n, seed=seed)
        generated.append((prompts, seed, out))
        return out

    trainer.engine.generate = recording_generate
    started_from = []  # the weights each step trains from: theta_{t-1}
    for _ in range(steps):
        started_from.append(cpu_snapshot(trainer.model))
        trainer.step()
    for t in range(1, steps + 1):
        batch, old_logp = seen[t - 1]
        sampler = started_from[max(t - 1 - k, 0)]
        assert torch.equal(logprobs_with(trainer, sampler, batch), old_logp), t
        if t > 1:  # step 1 starts from the initial weights, stale or not
            current = logprobs_with(trainer, started_from[t - 1], batch)
            assert not torch.allclose(current, old_logp), t
        prompts, seed, samples = generated[t - 1]
        model = copy.deepcopy(trainer.model)
        model.load_state_dict(sampler)
        again = HFEngine(model, trainer.tokenizer, batch_size=trainer.cfg.rollout.gen_batch_size)
        r = trainer.cfg.rollout
        regenerated = RolloutEngine(again, r.temperature, r.top_p, r.max_new_tokens)
        assert [[s.token_ids for s in g] for g in regenerated.generate(prompts, n=4, seed=seed)] \
            == [[s.token_ids for s in g] for g in samples], t
    if own_weights:  # what was pushed last: the weights step steps+1-k would start from
        pushed = trainer.engine.engine.model.state_dict()
        for name, tensor in started_from[steps - k].items():
            assert torch.equal(pushed[name], tensor), name


def test_resume_restores_the_lagged_weights(make_cfg):
    """Cut after step 2 with k = 2 (the copy still at theta_0, theta_1 and theta_2 waiting):
    the resumed run equals the uninterrupted one, metrics and final weights bit for bit; a
    resume with another k is refused before anything runs."""
    common = {"rollout": {**SMALL, "staleness": 2}, "optim": {"steps": 4, "lr": 1e-2}}
    full = train(make_cfg("full", **common))
    cut = train(make_cfg("cut", debug={"stop_after_steps": 2}, **common))
    assert (cut / "state" / "resume.pt").exists() and len(untimed(cut)) == 2
    state = torch.load(cut / "state" / "resume.pt", weights_only=True)
    assert state["staleness"] == {"k": 2, "pending": 2}
    with pytest.raises(ValueError, match="rollout.staleness=1 but the resume state"):
        train(make_cfg("cut", rollout={**SMALL, "staleness": 1}, optim={"steps": 4, "lr": 1e-2}))
    resumed = train(make_cfg("cut", **common))
    assert untimed(resumed) == untimed(full)
    for name, tensor in final_weights(full, 4).items():
        assert torch.equal(final_weights(resumed, 4)[name], tensor), name
