# Evaluation jobs, grouped by eval.group (sweep/spec.py): every job starts its engine once
# and swaps the weights per checkpoint (python -m eval with several --checkpoint).
#   run:        one job per run (cell x seed): all its checkpoints x all benchmarks. Fewest
#               jobs and start-ups; the default (a 2-core laptop pays ~10 s per start-up).
#   checkpoint: one job per (run, checkpoint step): all benchmarks. More jobs that can run
#               in parallel (a cluster with idle GPUs).
#   train:      no evaluation job: the train job evaluates its run in the same process
#               (train.smk, sweep/job.py), one start-up per run instead of two (config/default).
# `run` waits for the run's DONE. `checkpoint` waits for the training segment that wrote
# its checkpoint (train.smk: with this grouping a run trains in one job per eval step), so
# evaluation overlaps training: Snakemake sees a job's outputs only when the job ends, so
# a checkpoint written in the middle of one long train job could not release a job earlier.


if SWEEP.eval.group == "run":

    rule evaluate_run:
        input:
            done=str(RUN.done),
        output:
            **run_evals(),
        params:
            args=lambda wc: eval_args(SWEEP, wc.run_id, STEPS, BENCHES),
        conda:
            "../envs/harness.yaml"
        log:
            str(LAYOUT.log("eval", "{run_id}", "all")),
        benchmark:
            str(LAYOUT.benchmark("eval", "{run_id}", "all"))
        threads: SWEEP.resources.evaluate.cpus
        resources:
            gpu=SWEEP.resources.evaluate.gpus,  # the SLURM plugin's name: --gpus=N
            mem_mb=SWEEP.resources.evaluate.mem_mb,
            # the job evaluates every checkpoint: runtime_min is per checkpoint
            runtime=lambda wc, attempt: runtime("evaluate")(wc, attempt) * len(STEPS),
        shell:
            "python -m eval {params.args} > {log} 2>&1"

elif SWEEP.eval.group == "checkpoint":

    rule evaluate:
        input:
            trained=lambda wc: str(LAYOUT.run(wc.run_id).segment(wc.step)
                                   if int(wc.step) in SEGMENTS else LAYOUT.run(wc.run_id).done),
        output:
            summaries=[summary_for_report(str(RUN.eval_summary("{step}", b)), b, "{step}")
                       for b in BENCHES],
            samples=[str(RUN.eval_samples("{step}", b)) for b in BENCHES],
        params:
            args=lambda wc: eval_args(SWEEP, wc.run_id, [int(wc.step)], BENCHES),
        conda:
            "../envs/harness.yaml"
        log:
            str(LAYOUT.log("eval", "{run_id}", "step_{step}")),
        benchmark:
            str(LAYOUT.benchmark("eval", "{run_id}", "step_{step}"))
        threads: SWEEP.resources.evaluate.cpus
        resources:
            gpu=SWEEP.resources.evaluate.gpus,  # the SLURM plugin's name: --gpus=N
            mem_mb=SWEEP.resources.evaluate.mem_mb,
            runtime=runtime("evaluate"),
        shell:
            "python -m eval {params.args} > {log} 2>&1"


rule evaluate_initial:
    input:
        model=MODEL_INPUT,
    output:
        summaries=[summary_for_report(str(LAYOUT.initial.eval_summary(0, b)), b, 0,
                                      run="initial model") for b in BENCHES],
        samples=[str(LAYOUT.initial.eval_samples(0, b)) for b in BENCHES],
    params:
        args=initial_eval_args(SWEEP, BENCHES),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("eval", "initial", "step_0")),
    benchmark:
        str(LAYOUT.benchmark("eval", "initial", "step_0"))
    threads: SWEEP.resources.evaluate.cpus
    resources:
        gpu=SWEEP.resources.evaluate.gpus,
        mem_mb=SWEEP.resources.evaluate.mem_mb,
        runtime=runtime("evaluate"),
    shell:
        "python -m eval {params.args} > {log} 2>&1"
