# One training job per cell x seed. The resume state is not a declared output (Snakemake
# would delete it before a retry); the output is the DONE marker the trainer writes last.


localrules:
    run_config,


rule run_config:
    output:
        f"{OUT}/configs/{{run_id}}.yaml",
    params:
        cfg=lambda wc: run_config(SWEEP, RUNS[wc.run_id]),
    log:
        f"{OUT}/logs/run_config/{{run_id}}.log",
    run:
        from sweep.runconfig import write_run_config

        write_run_config(output[0], params.cfg)


rule train:
    input:
        cfg=f"{OUT}/configs/{{run_id}}.yaml",
        model=[MODEL_DIR] if TINY else [],
    output:
        f"{OUT}/runs/{{run_id}}/DONE",
    params:
        parent=f"{OUT}/mlflow_parent_run_id",
        trainer=train_command(SWEEP),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/train/{{run_id}}.log",
    benchmark:
        f"{OUT}/benchmarks/train/{{run_id}}.tsv"
    threads: SWEEP.resources.train.cpus
    resources:
        mem_mb=SWEEP.resources.train.mem_mb,
        runtime=runtime("train"),
        **train_slurm_resources(SWEEP),  # GPUs, nodes, tasks in the SLURM plugin's names
    # exec: the trainer replaces the shell, so a scheduler's SIGTERM (SLURM's time-limit
    # warning, scancel, requeue) reaches it instead of killing the shell around it.
    shell:
        "exec {params.trainer} --config {input.cfg} --parent-run-id-file {params.parent}"
        " > {log} 2>&1"
