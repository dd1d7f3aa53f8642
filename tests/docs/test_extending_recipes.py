"""docs/extending.md is true: each recipe, done at runtime the way the page says, is picked
up by the harness (the sweep expands it, the trainer or the evaluation runs it).

The recipes edit a registry in a source file; here the same registration happens at runtime
(monkeypatch undoes it after each test), then the real entry points run: sweep expansion,
`trainer.loop.train` on a small tiny model, `python -m eval` in-process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from algorithms import ADVANTAGE_ESTIMATORS, METHODS, ClipConfig, LossConfig, Method
from sweep import expand, parse_sweep
from sweep.runconfig import run_config
from trainer.config import parse_run_config
from trainer.loop import train
from trainer.tiny import TinyConfig, build_tiny

# The trainer tests' small model: 1 layer, 40 SFT steps, a few seconds to build.
SMALL = TinyConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                   sft_steps=40, sft_batch_size=16, sft_lr=5e-3)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", SMALL, progress=False)


def run_cfg(tiny_dir: Path, out: Path, **sections):
    """Two small RL steps (4 prompts x 4 samples, 16 new tokens), no MLflow."""
    data = {
        "run_id": out.name, "out_dir": str(out), "seed": 0,
        "model": {"path": str(tiny_dir), "device": "cpu"},
        "rollout": {"n": 4, "prompts_per_step": 4, "max_new_tokens": 16, "overlong_buffer": 4,
                    "dynamic_sampling": False},
        "optim": {"steps": 2, "lr": 1e-3},
        "tracking": {"mlflow_uri": None, "progress": False},
        **sections,
    }
    return parse_run_config(data, f"test:{out.name}")


def metric_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def sweep(**kw):
    base = {"name": "recipes", "eval": {"steps": [2], "benchmarks": ["toy"]}}
    return parse_sweep({**base, **kw}, "recipe.yaml")


# --- a method -------------------------------------------------------------------------------


def test_a_method_from_existing_pieces(monkeypatch, tiny_dir, tmp_path):
    method = Method(
        name="RPG-URKL-BETA1E-3",
        loss=LossConfig(objective="rpg", divergence="urkl", form="reinforce",
                        clip=ClipConfig(eps_low=0.2, eps_high=0.28, dual_c=10.0), beta=1e-3),
        advantage="group_mean", reference="rollout", dynamic_sampling=True,
        overlong_shaping=True, source="docs/extending.md example",
    )
    monkeypatch.setitem(METHODS, method.name, method)  # = one more Method(...) in _METHODS

    cells, _ = expand(sweep(methods=[method.name]))
    assert [c.run_id for c in cells] == ["rpg-urkl-beta1e-3_s0"]
    cfg = run_config(sweep(methods=[method.name]), cells[0])
    assert cfg["method"]["name"] == method.name

    out = train(run_cfg(tiny_dir, tmp_path / "m", method={"name": method.name}))
    assert [r["step"] for r in metric_lines(out)] == [1, 2]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["tags"]["method"] == method.name


# --- an advantage estimator -------------------------------------------------------------------


def test_an_advantage_estimator(monkeypatch, tiny_dir, tmp_path):
    calls = []

    def leave_one_out(rewards, group_ids, returns, mask):
        """A - mean of the *other* samples of the group (RLOO)."""
        calls.append(len(rewards))
        same = group_ids[:, None] == group_ids[None, :]
        n = same.sum(1).to(rewards.dtype)
        others = (same.to(rewards.dtype) @ rewards - rewards) / (n - 1).clamp(min=1)
        return rewards - others

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "leave_one_out", leave_one_out)

    # The method registry accepts it, and so does a run config override.
    Method(name="x", loss=METHODS["RPG-URKL"].loss, advantage="leave_one_out")
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0])
    from algorithms import compute_advantages

    adv = compute_advantages(rewards, torch.tensor([0, 0, 1, 1]), "leave_one_out")
    assert torch.equal(adv, torch.tensor([2.0, -2.0, -2.0, 2.0]))
    assert torch.equal(adv, compute_advantages(rewards, torch.tensor([0, 0, 1, 1]), "rloo"))

    calls.clear()
    out = train(run_cfg(tiny_dir, tmp_path / "a",
                        method={"name": "RPG-URKL", "advantage": "leave_one_out"}))
    assert len(metric_lines(out)) == 2 and calls == [16, 16]  # once per step, 4 x 4 samples


# --- a generation engine -----------------------------------------------------------------------


def test_a_generation_engine(monkeypatch, tiny_dir, tmp_path):
    from common.generation import ENGINES
    from common.generation.hf import HFEngine

    prompts = []

    class Counting(HFEngine):  # the hf engine's rollout set-up, generate counted
        name = "counting"

        def generate(self, prompts_, **kw):
            prompts.append(len(prompts_))
            return super().generate(prompts_, **kw)

    monkeypatch.setitem(ENGINES, Counting.name, Counting)  # = @register_engine on the class
    out = train(run_cfg(tiny_dir, tmp_path / "e", rollout={
        "engine": "counting", "n": 4, "prompts_per_step": 4, "max_new_tokens": 16,
        "overlong_buffer": 4, "dynamic_sampling": False}))
    assert [r["step"] for r in metric_lines(out)] == [1, 2] and prompts == [4, 4]
    monkeypatch.delitem(ENGINES, Counting.name)
    with pytest.raises(ValueError, match="engine='counting' is not registered"):
        run_cfg(tiny_dir, tmp_path / "f", rollout={"engine": "counting"})


# --- a benchmark ------------------------------------------------------------------------------


def test_a_benchmark(monkeypatch, tiny_dir, tmp_path):
    from eval.__main__ import main as eval_main
    from eval.benchmarks import BENCHMARKS, HubSource

    monkeypatch.setitem(BENCHMARKS, "gsm8k", HubSource("openai/gsm8k", split="test",
                                                        problem_column="question"))
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "problem": f"What is {i} + {i}?",
                                        "answer": str(2 * i)}) + "\n" for i in range(3)))

    spec = sweep(methods=["GRPO"], eval={"steps": [2], "benchmarks": ["toy", "gsm8k"],
                                        "files": {"gsm8k": str(data)}})
    assert spec.eval.benchmarks == ["toy", "gsm8k"]

    out = tmp_path / "eval"
    code = eval_main(["--checkpoint", str(tiny_dir), "--benchmark", "gsm8k",
                      "--benchmark-file", str(data), "--n", "2", "--max-new-tokens", "8",
                      "--scorers", "dapo", "--step", "0", "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "gsm8k.json").read_text())
    assert summary["benchmark"] == "gsm8k" and summary["num_problems"] == 3
    assert set(summary["scorers"]) == {"dapo"}


# --- a sweep axis -----------------------------------------------------------------------------

# One example value per axis. A new axis must add one here: the test below then checks that
# the sweep applies it, names the run after it and hands it to the trainer.
AXIS_EXAMPLES = {
    "divergence": "rkl",
    "form": "reinforce",
    "ratio_level": "sequence",
    "estimator": "k2",
    "kl_placement": "reward",
    "kl_importance_weight": "detached",
    "clip": {"eps_low": 0.1, "eps_high": 0.1, "dual_c": 3.0},
    "beta": 1e-3,
    "entropy_coef": 1e-3,
    "reference": {"schedule": "every_k", "k": 5},
    "correction": "token_tis",
    "staleness": 1,
    "lora": {"rank": 8, "lr": 1e-3},
}
# Axes whose example needs another axis to make a valid loss (sequence ratios are unclipped).
COMPANIONS = {"ratio_level": {"clip": [None]}}


def test_two_rollout_axes_reach_one_run_config_together():
    """correction and staleness both write under `rollout`: neither may drop the other."""
    spec = sweep(methods=["GRPO"], axes={"correction": ["token_tis"], "staleness": [1]})
    (cell,), _ = expand(spec)
    cfg = parse_run_config(run_config(spec, cell), "cell")
    assert (cfg.rollout.correction.mode, cfg.rollout.staleness) == ("token_tis", 1)


def test_every_sweep_axis_has_an_example():
    from sweep.spec import Axes

    missing = set(Axes.model_fields) - set(AXIS_EXAMPLES)
    assert not missing, f"add an example value for the new axis {sorted(missing)} to AXIS_EXAMPLES"


@pytest.mark.parametrize("axis", sorted(AXIS_EXAMPLES))
def test_a_sweep_axis_reaches_the_run_config(axis):
    """The sweep file accepts the axis, some method applies it, the run id spells it, and the
    trainer's run config carries it (loss axes in `method`, the reference schedule in
    `method.reference`, staleness in `rollout`, lora in `model`)."""
    value = AXIS_EXAMPLES[axis]
    schema = json.loads((Path(__file__).resolve().parents[2]
                         / "workflow/schemas/sweep.schema.json").read_text())
    assert axis in schema["$defs"]["Axes"]["properties"], "regenerate the schema: python -m sweep schema"

    spec = sweep(methods=list(METHODS), axes={axis: [value], **COMPANIONS.get(axis, {})})
    cells, _ = expand(spec)
    applied = [c for c in cells if axis in c.axes]
    assert applied, f"axis {axis!r} applies to no registered method"
    plain_ids = {c.run_id for c in expand(sweep(methods=list(METHODS)))[0]}
    for cell in applied:
        if axis in ("divergence", "form"):  # an RPG method is renamed for what it becomes
            assert value.upper() in cell.label, cell.label
        else:
            assert cell.run_id not in plain_ids, f"{cell.run_id}: the run id must name the axis"
        cfg = parse_run_config(run_config(spec, cell), "cell")
        resolved = cfg.resolved_method()
        if axis == "correction":  # a rollout setting, not the loss's
            assert cfg.rollout.correction.mode == value
        elif axis == "staleness":  # a rollout setting, not the method's
            assert cfg.rollout.staleness == value
        elif axis == "lora":  # a model setting (and the lr it names)
            assert (cfg.model.lora.rank, cfg.optim.lr) == (value["rank"], value["lr"])
        elif axis == "reference":
            assert resolved.reference == value["schedule"]
        elif axis == "clip":
            assert resolved.loss.clip == ClipConfig(**value)
        else:
            assert getattr(resolved.loss, axis) == value


# --- a new RPG divergence ---------------------------------------------------------------------


def test_a_new_rpg_divergence_is_one_registration():
    """The recipe's one registration: the config, the sweep axis, the loss (both forms), the
    exact form and the audit's rows all take it from DIVERGENCES."""
    from algorithms import kl
    from algorithms.audit import audit_rows
    from algorithms.config import DIVERGENCES, LossConfig
    from algorithms.losses import RpgDivergence, compute_policy_loss
    from sweep.spec import Axes

    def half_rkl(logw, logq):  # (logw, logq) -> KL part of L without beta
        return 0.5 * logw.exp() * (logw - logq)

    DIVERGENCES.register("halfrkl", RpgDivergence(
        half_rkl, lambda pi, ref: 0.5 * kl.kl(pi, ref), "KL(pi||ref)/2"))
    try:
        assert Axes(divergence=["halfrkl"]).divergence == ["halfrkl"]
        audited = {r.cfg.divergence for r in audit_rows() if r.family == "rpg"}
        assert audited == set(DIVERGENCES)
        p = torch.tensor([0.2, 0.8], dtype=torch.float64)
        ref = torch.tensor([0.5, 0.5], dtype=torch.float64)
        assert torch.isfinite(kl.divergence("halfrkl", p, ref))
        logp = torch.zeros(2, 3, requires_grad=True)
        for form in ("differentiable", "reinforce"):
            cfg = LossConfig(objective="rpg", divergence="halfrkl", form=form, beta=0.1)
            loss, _ = compute_policy_loss(cfg, logp, logp.detach(), logp.detach() - 0.1,
                                          torch.tensor([1.0, -1.0]), torch.ones(2, 3))
            assert torch.isfinite(loss)
    finally:
        del DIVERGENCES["halfrkl"]


# --- a loss objective -------------------------------------------------------------------------


@pytest.fixture
def tis():
    """The recipe's objective: REINFORCE with a weight truncated from above and detached (the
    shipped `cispo` bounds it on both sides)."""
    from algorithms.clipping import clip_regions
    from algorithms.losses import Terms, _check_penalty, _penalty
    from algorithms.objectives import OBJECTIVES, register_objective

    @register_objective("tis", check=_check_penalty, default_form="reinforce")
    def _tis_terms(cfg, logp, logw, logq, adv):
        """Truncated IS: -SG(min(w, 1 + eps_high) A) log pi; every token keeps its gradient."""
        w = logw.exp()
        cap = 1.0 + (cfg.clip.eps_high if cfg.clip is not None else 0.28)
        pg = -(w.clamp(max=cap) * adv).detach() * logp
        return Terms(pg, _penalty(cfg, logp, logw, logq), clip_regions(w, adv, None), w)

    yield
    del OBJECTIVES["tis"]


def test_a_loss_objective(tis, monkeypatch, tiny_dir, tmp_path):
    from algorithms import compute_policy_loss

    loss_cfg = {"objective": "tis", "clip": {"eps_low": 0.2, "eps_high": 0.28, "dual_c": None},
                "estimator": "k3", "kl_placement": "loss", "beta": 1e-3}
    cfg = LossConfig(**loss_cfg)
    assert cfg.form == "reinforce"
    with pytest.raises(ValueError, match="objective='tis': only rpg takes a divergence"):
        LossConfig(**loss_cfg, divergence="fkl")  # the rules it registered with

    # The weight is truncated at 1.28 and detached: d loss / d logp = -min(w, 1.28) A / 2.
    logp = torch.tensor([[0.5, -0.5]], requires_grad=True)
    old = torch.zeros(1, 2)
    no_kl = LossConfig(**{**loss_cfg, "estimator": None, "kl_placement": "none", "beta": 0.0})
    loss, _ = compute_policy_loss(no_kl, logp, old, None, torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    expected = -torch.tensor([[1.28, torch.tensor(-0.5).exp().item()]]) / 2
    assert torch.allclose(logp.grad, expected)

    # A method built on it (the method recipe), then a sweep cell and a training run.
    monkeypatch.setitem(METHODS, "TIS", Method(name="TIS", loss=cfg, advantage="group_mean"))
    cells, _ = expand(sweep(methods=["TIS"], axes={"beta": [1e-3, 1e-2]}))
    assert [c.run_id for c in cells] == ["tis_beta1e-3_s0", "tis_beta0.01_s0"]
    out = train(run_cfg(tiny_dir, tmp_path / "l", method={"name": "TIS"}))
    rows = metric_lines(out)
    assert len(rows) == 2 and all(r["kl_loss"] is not None for r in rows)


# --- a reference schedule ---------------------------------------------------------------------


@pytest.fixture
def every_step():
    """The recipe's schedule: the reference is refreshed at every rollout boundary."""
    from algorithms.reference import (
        REFERENCE_SCHEDULES,
        ReferenceSchedule,
        register_reference_schedule,
    )

    @register_reference_schedule("every_step")
    class EveryStepReference(ReferenceSchedule):
        """Refreshed after every RL step: the reference lags the policy by one batch."""

        def refresh_due(self, kl_to_ref):
            return True

    yield
    del REFERENCE_SCHEDULES["every_step"]


def test_a_reference_schedule(every_step, tiny_dir, tmp_path):
    spec = sweep(methods=["GRPO"], axes={"reference": [{"schedule": "every_step"}]})
    cells, _ = expand(spec)
    assert [c.run_id for c in cells] == ["grpo_ref-everystep_s0"]
    assert run_config(spec, cells[0])["method"]["reference"]["schedule"] == "every_step"

    out = train(run_cfg(tiny_dir, tmp_path / "r",
                        method={"name": "GRPO", "reference": {"schedule": "every_step"}}))
    assert [r["ref_updates"] for r in metric_lines(out)] == [1, 2]


# --- a scorer ---------------------------------------------------------------------------------


def scorer_names() -> tuple[str, ...]:
    from eval.run import grading  # the grading module evaluation uses, wherever it lives

    return tuple(grading.SCORERS)


@pytest.mark.parametrize("scorer", scorer_names())
def test_every_scorer_is_accepted_and_grades(scorer, tmp_path):
    """A name added to SCORERS is a valid reward grader (task.scorer), a valid sweep and
    CLI scorer, and grades: a right answer is correct, a wrong one is not."""
    from eval.run import EvalConfig, grading

    answers = ["... so Answer: \\boxed{42}", "... so Answer: \\boxed{41}"]  # every scorer reads these
    results = grading.grade_many(answers, ["42", "42"], scorer)
    assert [r.correct for r in results] == [True, False]
    assert all(r.status in grading.STATUSES for r in results)
    cfg = parse_run_config({"model": {"path": "m"}, "task": {"scorer": scorer}}, "test")
    assert cfg.task.scorer == scorer
    spec = sweep(methods=["GRPO"], eval={"steps": [2], "benchmarks": ["toy"], "scorers": [scorer]})
    assert spec.eval.scorers == [scorer]
    assert EvalConfig(checkpoint="c", benchmark="toy", out="o", scorers=(scorer,)).scorers == (scorer,)
