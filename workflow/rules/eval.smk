# One evaluation job per cell x seed x checkpoint step x benchmark.


rule evaluate:
    input:
        done=f"{OUT}/runs/{{run_id}}/DONE",
    output:
        summary=f"{OUT}/runs/{{run_id}}/eval/step_{{step}}/{{bench}}.json",
        samples=f"{OUT}/runs/{{run_id}}/eval/step_{{step}}/{{bench}}.jsonl",
    params:
        args=lambda wc: eval_args(SWEEP, wc.run_id, int(wc.step), wc.bench),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/eval/{{run_id}}/step_{{step}}_{{bench}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval/{{run_id}}/step_{{step}}_{{bench}}.tsv"
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
        summary=f"{OUT}/initial/eval/step_0/{{bench}}.json",
        samples=f"{OUT}/initial/eval/step_0/{{bench}}.jsonl",
    params:
        args=lambda wc: initial_eval_args(SWEEP, wc.bench),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/eval/initial/step_0_{{bench}}.log",
    benchmark:
        f"{OUT}/benchmarks/eval/initial/step_0_{{bench}}.tsv"
    threads: SWEEP.resources.evaluate.cpus
    resources:
        gpus=SWEEP.resources.evaluate.gpus,
        mem_mb=SWEEP.resources.evaluate.mem_mb,
        runtime=runtime("evaluate"),
    shell:
        "python -m eval {params.args} > {log} 2>&1"
