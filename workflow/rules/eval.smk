# Evaluation jobs, grouped by eval.group (sweep/spec.py): every job starts its engine once
# and swaps the weights per checkpoint (python -m eval with several --checkpoint).
#   run:        one job per run (cell x seed): all its checkpoints x all benchmarks. Fewest
#               jobs and start-ups; the default (a 2-core laptop pays ~10 s per start-up).
#   checkpoint: one job per (run, checkpoint step): all benchmarks. More jobs that can run
#               in parallel (a cluster with idle GPUs).
# `run` waits for the run's DONE. `checkpoint` waits for the training segment that wrote
# its checkpoint (train.smk: with this grouping a run trains in one job per eval step), so
# evaluation overlaps training: Snakemake sees a job's outputs only when the job ends, so
# a checkpoint written in the middle of one long train job could not release a job earlier.


if SWEEP.eval.group == "run":

    rule evaluate_run:
        input:
            done=f"{OUT}/runs/{{run_id}}/DONE",
        output:
            summaries=[summary_for_report(f"{OUT}/runs/{{run_id}}/eval/step_{s}/{b}.json", b, s)
                       for s in STEPS for b in BENCHES],
            samples=[f"{OUT}/runs/{{run_id}}/eval/step_{s}/{b}.jsonl"
                     for s in STEPS for b in BENCHES],
        params:
            args=lambda wc: eval_args(SWEEP, wc.run_id, STEPS, BENCHES),
        conda:
            "../envs/harness.yaml"
        log:
            f"{OUT}/logs/eval/{{run_id}}/all.log",
        benchmark:
            f"{OUT}/benchmarks/eval/{{run_id}}/all.tsv"
        threads: SWEEP.resources.evaluate.cpus
        resources:
            gpu=SWEEP.resources.evaluate.gpus,  # the SLURM plugin's name: --gpus=N
            mem_mb=SWEEP.resources.evaluate.mem_mb,
            # the job evaluates every checkpoint: runtime_min is per checkpoint
            runtime=lambda wc, attempt: runtime("evaluate")(wc, attempt) * len(STEPS),
        shell:
            "python -m eval {params.args} > {log} 2>&1"

else:

    rule evaluate:
        input:
            trained=lambda wc: str(LAYOUT.run(wc.run_id).segment(wc.step)
                                   if int(wc.step) in SEGMENTS else LAYOUT.run(wc.run_id).done),
        output:
            summaries=[summary_for_report(f"{OUT}/runs/{{run_id}}/eval/step_{{step}}/{b}.json",
                                          b, "{step}") for b in BENCHES],
            samples=[f"{OUT}/runs/{{run_id}}/eval/step_{{step}}/{b}.jsonl" for b in BENCHES],
        params:
            args=lambda wc: eval_args(SWEEP, wc.run_id, [int(wc.step)], BENCHES),
        conda:
            "../envs/harness.yaml"
        log:
            f"{OUT}/logs/eval/{{run_id}}/step_{{step}}.log",
        benchmark:
            f"{OUT}/benchmarks/eval/{{run_id}}/step_{{step}}.tsv"
        threads: SWEEP.resources.evaluate.cpus
        resources:
            gpu=SWEEP.resources.evaluate.gpus,  # the SLURM plugin's name: --gpus=N
            mem_mb=SWEEP.resources.evaluate.mem_mb,
            runtime=runtime("evaluate"),
        shell:
            "python -m eval {params.args} > {log} 2>&1"


rule evaluate_initial:
    input:
        model=[MODEL_DIR] if TINY else [],
    output:
        summaries=[summary_for_report(f"{OUT}/initial/eval/step_0/{b}.json", b, 0,
                                      run="initial model") for b in BENCHES],
        samples=[f"{OUT}/initial/eval/step_0/{b}.jsonl" for b in BENCHES],
    params:
        args=initial_eval_args(SWEEP, BENCHES),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/eval/initial/step_0.log",
    benchmark:
        f"{OUT}/benchmarks/eval/initial/step_0.tsv"
    threads: SWEEP.resources.evaluate.cpus
    resources:
        gpu=SWEEP.resources.evaluate.gpus,
        mem_mb=SWEEP.resources.evaluate.mem_mb,
        runtime=runtime("evaluate"),
    shell:
        "python -m eval {params.args} > {log} 2>&1"
