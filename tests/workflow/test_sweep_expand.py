"""Sweep expansion: deterministic cells, stable readable run ids, documented drop rules,
errors that name the file and the key."""

from pathlib import Path

import pytest

from sweep import SweepError, expand, parse_sweep

EVAL = {"steps": [10], "benchmarks": ["toy"]}


def sweep(**kw):
    return parse_sweep({"name": "t", "eval": EVAL, **kw}, "cfg.yaml")


def test_methods_only_cells_use_method_names_and_seeds():
    cells, notes = expand(sweep(methods=["GRPO", "RPG-REINFORCE-URKL"], seeds=[0, 1]))
    assert [c.run_id for c in cells] == ["grpo_s0", "grpo_s1", "rpg-reinforce-urkl_s0",
                                         "rpg-reinforce-urkl_s1"]
    assert cells[2].label == "RPG-REINFORCE-URKL" and cells[2].tags["method"] == "RPG-REINFORCE-URKL"
    assert notes == []


def test_expansion_is_deterministic_and_ids_are_stable():
    kw = dict(methods=["RPG-URKL", "GRPO"], axes={"beta": [1e-3, 1e-4],
              "clip": [{"eps_low": 0.1, "eps_high": 0.1}, {"eps_low": 0.2, "eps_high": 0.28}]})
    a, _ = expand(sweep(**kw))
    b, _ = expand(sweep(**kw))
    assert [c.run_id for c in a] == [c.run_id for c in b]
    assert "rpg-urkl_clip0.1-0.1-10_beta1e-3_s0" in {c.run_id for c in a}
    assert len({c.run_id for c in a}) == len(a) == 8


def test_axis_not_applicable_is_collapsed_with_a_note():
    cells, notes = expand(sweep(methods=["RPG-URKL", "DAPO"], axes={"estimator": ["k1", "k3"]}))
    assert [c.run_id for c in cells] == ["rpg-urkl_s0", "dapo_s0"]
    assert any("RPG-URKL: axis 'estimator' does not apply" in n for n in notes)


def test_peer_estimators_and_weights_spell_plain_run_ids():
    """verl's "+" estimators and NeMo-RL's score weight (algorithms/kl.py, docs/kl-certificate.md)
    name a run without regex characters: the workflow matches run ids as a regex."""
    cells, _ = expand(sweep(methods=["GRPO"], axes={"estimator": ["k3+", "low_var_kl"],
                                                    "kl_importance_weight": ["score"]}))
    assert [c.run_id for c in cells] == ["grpo_k3plus_iwscore_s0", "grpo_low_var_kl_iwscore_s0"]


def test_divergence_and_form_axes_rename_rpg_cells_and_merge_duplicates():
    cells, notes = expand(sweep(methods=["RPG-URKL", "RPG-FKL"],
                                axes={"divergence": ["fkl", "urkl"], "form": ["reinforce"]}))
    assert [c.label for c in cells] == ["RPG-REINFORCE-FKL", "RPG-REINFORCE-URKL"]
    assert sum("kept once" in n for n in notes) == 2


def test_invalid_combination_is_dropped_with_reason():
    cells, notes = expand(sweep(methods=["GRPO"], axes={"kl_placement": ["loss", "reward"],
                                                          "kl_importance_weight": ["differentiable"]}))
    assert [c.run_id for c in cells] == ["grpo_inloss_iwdiff_s0"]
    assert any("dropped" in n and "kl_importance_weight" in n for n in notes)


def test_empty_grid_and_unknown_method_are_errors_naming_the_file():
    with pytest.raises(SweepError, match="cfg.yaml.*no valid cell"):
        expand(sweep(methods=["GRPO"], axes={"kl_placement": ["reward"],
                                             "kl_importance_weight": ["detached"]}), "cfg.yaml")
    with pytest.raises(SweepError, match="cfg.yaml: methods: .*RPG-URKL"):
        expand(sweep(methods=["NOPE"]), "cfg.yaml")


def test_staleness_axis_sets_the_rollout_at_any_world_size():
    """Staleness leaves the method alone, so its cells must not merge as duplicates; each
    run config carries its k in `rollout`; several GPUs per train job (FSDP2, the lag
    sharded too) expand the same cells."""
    from sweep.runconfig import run_config

    spec = sweep(methods=["GRPO"], axes={"staleness": [0, 2]},
                 base={"model": {"path": "tiny"}})
    cells, notes = expand(spec)
    assert [c.run_id for c in cells] == ["grpo_stale0_s0", "grpo_stale2_s0"] and notes == []
    assert [run_config(spec, c)["rollout"]["staleness"] for c in cells] == [0, 2]
    assert cells[1].tags["staleness"] == "2"
    multi, _ = expand(sweep(methods=["GRPO"], axes={"staleness": [0, 1]},
                            resources={"train": {"gpus": 2}}), "cfg.yaml")
    assert [c.run_id for c in multi] == ["grpo_stale0_s0", "grpo_stale1_s0"]
    with pytest.raises(SweepError, match=r"axes.staleness.0"):
        sweep(methods=["GRPO"], axes={"staleness": [-1]})


def test_schema_errors_name_file_key_and_allowed_values():
    with pytest.raises(SweepError) as err:
        parse_sweep({"name": "t", "methods": ["GRPO"], "eval": EVAL,
                     "axes": {"divergence": ["hellinger"]}}, "config/x.yaml")
    msg = str(err.value)
    assert "config/x.yaml" in msg and "axes.divergence.0" in msg and "'fkl'" in msg
    with pytest.raises(SweepError, match="bogus"):
        parse_sweep({"name": "t", "methods": ["GRPO"], "eval": EVAL, "bogus": 1}, "x.yaml")


def test_committed_json_schema_is_generated_from_the_model():
    import json
    from pathlib import Path

    from sweep.__main__ import schema

    committed = Path(__file__).resolve().parents[2] / "workflow/schemas/sweep.schema.json"
    assert json.loads(committed.read_text()) == schema()


def test_lora_axis_sets_model_lora_and_only_the_lr_it_names():
    """null is full fine-tuning; a LoRA value writes model.lora and, when it names one,
    that cell's optim.lr (never otherwise): the cells are distinct runs of one method."""
    from sweep.runconfig import run_config

    spec = sweep(methods=["GRPO"], axes={"lora": [None, {"rank": 4}, {"rank": 1, "lr": 1e-3}]},
                 base={"model": {"path": "tiny"}, "optim": {"lr": 1e-4}})
    cells, notes = expand(spec)
    assert [c.run_id for c in cells] == ["grpo_full_s0", "grpo_lora-r4_s0",
                                         "grpo_lora-r1-lr1e-3_s0"] and notes == []
    cfgs = [run_config(spec, c) for c in cells]
    assert [c["model"]["lora"] and c["model"]["lora"]["rank"] for c in cfgs] == [None, 4, 1]
    assert [c["optim"]["lr"] for c in cfgs] == [1e-4, 1e-4, 1e-3]
    assert cells[2].tags["lora"] == "lora-r1-lr1e-3" and cells[0].tags["lora"] == "full"
    with pytest.raises(SweepError, match=r"axes.lora.0.rank"):
        sweep(methods=["GRPO"], axes={"lora": [{"rank": 0}]})


def test_rollout_gpus_splits_the_train_jobs_gpus_or_is_refused_before_any_job():
    """The worker's GPUs are the job's last ones: torchrun gets the rest; a split that
    leaves the trainer none, spans nodes or differs between cells is refused, naming it."""
    from sweep.checks import check_rollout_gpus
    from sweep.runconfig import run_config, train_command

    def spec(gpus, nodes=1, axes=None, rollout_gpus=1):
        rollout = {"mode": "async", "staleness": 1, "engine": "vllm", "gpus": rollout_gpus}
        return sweep(methods=["GRPO"], axes=axes or {}, base={"rollout": rollout},
                     resources={"train": {"gpus": gpus, "nodes": nodes}})

    eight = spec(8, rollout_gpus=2)
    cells, _ = expand(eight)
    check_rollout_gpus(eight, [run_config(eight, c) for c in cells], "cfg.yaml")
    assert train_command(eight).endswith("--nproc-per-node 6 -m trainer")
    assert train_command(spec(2)) == "python -m trainer"  # one rank and the worker
    for bad, said in ((spec(1), r"base.rollout.gpus=1 leaves the trainer none of "
                                r"resources.train.gpus=1"),
                      (spec(4, nodes=2), r"base.rollout.gpus=1 with resources.train.nodes=2")):
        cells, _ = expand(bad)
        with pytest.raises(SweepError, match=said):
            check_rollout_gpus(bad, [run_config(bad, c) for c in cells], "cfg.yaml")
    ok = spec(4)
    configs = [run_config(ok, c) for c in expand(ok)[0]]
    configs[0]["rollout"]["gpus"] = 2  # as a cell's own override would set it
    with pytest.raises(SweepError, match=r"rollout.gpus=2 differs from the base's 1"):
        check_rollout_gpus(ok, configs, "cfg.yaml")


def test_a_gpu_sweep_whose_host_memory_passes_its_node_is_refused_before_any_job():
    """Qwen3-8B under LoRA served by vLLM asleep at level 1 holds ~21 GiB pinned on the
    host: a job that asks 32 GB is refused at parse time, one that asks 128 GB is not; a
    tiny model's jobs (all assumed per-process overhead) are never refused on it."""
    from sweep.checks import check_host_memory

    def spec(mem_mb, path="Qwen/Qwen3-8B"):
        base = {"model": {"path": path, "dtype": "bfloat16", "lora": {"rank": 32}},
                "rollout": {"engine": "vllm"}}
        return sweep(methods=["GRPO"], base=base,
                     resources={"train": {"gpus": 1, "mem_mb": mem_mb}})

    with pytest.raises(SweepError, match=r"cfg.yaml: base: about 40 GiB of host memory on the "
                                         r"first node, more than resources.train.mem_mb=32000"):
        check_host_memory(spec(32000), "cfg.yaml")
    check_host_memory(spec(128000), "cfg.yaml")
    tiny = str(Path(__file__).resolve().parents[2] / "data" / "tiny-model")
    check_host_memory(spec(100, path=tiny), "cfg.yaml")
