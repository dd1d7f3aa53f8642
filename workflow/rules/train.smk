# One training job per cell x seed. The resume state is not a declared output (Snakemake
# would delete it before a retry); the output is the DONE marker the trainer writes last.
# With eval.group: checkpoint the run trains in segments, one job each (train_segment: up
# to an eval step, then the state is saved and segments/step_N written), so each
# checkpoint's evaluation runs while the next segment trains; `train` is the last segment.


localrules:
    run_config,


# A shell rule, not `run:`: Snakemake's local executor runs a `run:` block in a freshly
# spawned Snakemake process (~11 s of CPU re-parsing the workflow, once per run); printf
# writes the YAML resolved at DAG build time, via a temp file and a rename (atomic).
rule run_config:
    output:
        str(LAYOUT.run_config("{run_id}")),
    params:
        text=lambda wc: run_config_yaml(run_config(SWEEP, RUNS[wc.run_id])),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("run_config", "{run_id}")),
    shell:
        "(printf '%s' {params.text:q} > {output}.tmp && mv {output}.tmp {output}) 2> {log}"


if SEGMENTS:

    rule train_segment:
        input:
            cfg=rules.run_config.output[0],
            model=MODEL_INPUT,
            previous=lambda wc: previous_segment(wc, before=int(wc.step)),
        output:
            str(RUN.segment("{step}")),
        wildcard_constraints:
            step=r"\d+",
        params:
            parent=str(LAYOUT.parent_run_id),
            trainer=train_command(SWEEP),
        conda:
            "../envs/harness.yaml"
        log:
            str(LAYOUT.log("train", "{run_id}.step_{step}")),
        benchmark:
            str(LAYOUT.benchmark("train", "{run_id}.step_{step}"))
        threads: SWEEP.resources.train.cpus
        resources:
            mem_mb=SWEEP.resources.train.mem_mb,
            runtime=runtime("train"),
            **train_slurm_resources(SWEEP),
        shell:
            "exec {params.trainer} --config {input.cfg} --until-step {wildcards.step}"
            " --parent-run-id-file {params.parent} > {log} 2>&1"


# With eval.group: train the job also evaluates the run's checkpoints, in the same process
# (`python -m sweep.job`, the trainer then the evaluation), so the outputs include them.
# With resources.train.seeds_together one job trains a cell's seeds one after another in one
# process (`python -m sweep.job --runs`): one start-up per cell, the outputs of every seed.
if SEEDS_TOGETHER:

    rule train:
        input:
            cfg=lambda wc: [str(LAYOUT.run_config(run_id)) for run_id in CELL_RUNS[wc.cell]],
            model=MODEL_INPUT,
        output:
            **cell_outputs(),
        wildcard_constraints:
            cell="|".join(re.escape(c) for c in CELL_RUNS),
        params:
            runs=lambda wc: cell_runs_json(wc.cell),
        conda:
            "../envs/harness.yaml"
        log:
            **{f"s{seed}": str(LAYOUT.log("train", f"{{cell}}_s{seed}")) for seed in SWEEP.seeds},
        benchmark:
            str(LAYOUT.benchmark("train", "{cell}"))
        threads: SWEEP.resources.train.cpus
        resources:
            mem_mb=SWEEP.resources.train.mem_mb,
            runtime=lambda wc, attempt: len(SWEEP.seeds) * runtime(
                "train", len(STEPS) if EVAL_IN_TRAIN else 0)(wc, attempt),
            **train_slurm_resources(SWEEP),
        # each run's output goes to its own log (sweep/job.py); exec as below
        shell:
            "exec python -m sweep.job --runs {params.runs:q}"

else:

    rule train:
        input:
            cfg=rules.run_config.output[0],
            model=MODEL_INPUT,
            previous=previous_segment,
        output:
            done=str(RUN.done),
            **(run_evals() if EVAL_IN_TRAIN else {}),
        params:
            parent=str(LAYOUT.parent_run_id),
            trainer=train_command(SWEEP),
            evaluate=lambda wc: (f" -- {eval_args(SWEEP, wc.run_id, STEPS, BENCHES)}"
                                 if EVAL_IN_TRAIN else ""),
        conda:
            "../envs/harness.yaml"
        log:
            str(LAYOUT.log("train", "{run_id}")),
        benchmark:
            str(LAYOUT.benchmark("train", "{run_id}"))
        threads: SWEEP.resources.train.cpus
        resources:
            mem_mb=SWEEP.resources.train.mem_mb,
            runtime=runtime("train", len(STEPS) if EVAL_IN_TRAIN else 0),
            **train_slurm_resources(SWEEP),  # GPUs, nodes, tasks in the SLURM plugin's names
        # exec: the trainer replaces the shell, so a scheduler's SIGTERM (SLURM's time-limit
        # warning, scancel, requeue) reaches it instead of killing the shell around it.
        shell:
            "exec {params.trainer} --config {input.cfg} --parent-run-id-file {params.parent}"
            "{params.evaluate} > {log} 2>&1"
