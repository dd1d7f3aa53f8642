# The cross-check stage (eval.crosscheck: [lighteval]): lighteval re-evaluates the chosen
# checkpoints (eval.crosscheck_steps, the last by default) on the same problems, prompts and
# sampling settings, in its own environment; analysis.concordance compares it with ours.
# Without eval.crosscheck the lists below are empty and none of these rules is in the DAG.
from snakemake.settings.types import DeploymentMethod

from sweep.crosscheck import crosscheck_export_args, crosscheck_run_args

CROSSCHECK_STEPS = SWEEP.eval.crosscheck_at if "lighteval" in SWEEP.eval.crosscheck else []
LIGHTEVAL_BACKEND = SWEEP.eval.backend  # hf: transformers (CPU or GPU); vllm: GPU
# One environment per backend for every sweep under results_dir, built once.
LIGHTEVAL_ENV = f"{SWEEP.results_dir}/envs/lighteval-{LIGHTEVAL_BACKEND}"
# With --software-deployment-method conda, Snakemake builds the env from the yaml instead.
LIGHTEVAL_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
LIGHTEVAL_PYTHON = "python" if LIGHTEVAL_CONDA else f"{LIGHTEVAL_ENV}/bin/python"
CROSSCHECK = [
    f"{OUT}/crosscheck/lighteval/{run_id}/step_{step}/{bench}.json"
    for run_id in RUN_IDS
    for step in CROSSCHECK_STEPS
    for bench in BENCHES
]
CONCORDANCE = [f"{OUT}/crosscheck/concordance.md"] if CROSSCHECK else []


# lighteval_env is local: it needs a package index, which cluster nodes often cannot reach.
localrules:
    lighteval_env,
    crosscheck_benchmark,
    lighteval_summary,
    concordance,


rule lighteval_env:
    input:
        requirements=f"workflow/envs/lighteval-{LIGHTEVAL_BACKEND}.txt",
    output:
        directory(LIGHTEVAL_ENV),
    conda:
        "../envs/harness.yaml"
    log:
        f"{SWEEP.results_dir}/envs/lighteval-{LIGHTEVAL_BACKEND}.log",
    benchmark:
        f"{SWEEP.results_dir}/envs/lighteval-{LIGHTEVAL_BACKEND}.tsv"
    shell:
        "python -m eval.lighteval_convert build-env --requirements {input.requirements}"
        " --out {output} > {log} 2>&1"


# The problems `python -m eval` evaluates (same file or generator, same limit), with the
# user message rendered by our template: what lighteval's task reads.
rule crosscheck_benchmark:
    output:
        f"{OUT}/crosscheck/benchmarks/{{bench}}/{{bench}}.jsonl",
    params:
        args=lambda wc: crosscheck_export_args(SWEEP, wc.bench),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/crosscheck/benchmark_{{bench}}.log",
    shell:
        "python -m eval.lighteval_convert export {params.args} --out {output} > {log} 2>&1"


rule lighteval:
    input:
        env=[] if LIGHTEVAL_CONDA else [LIGHTEVAL_ENV],
        benchmark=f"{OUT}/crosscheck/benchmarks/{{bench}}/{{bench}}.jsonl",
        done=f"{OUT}/runs/{{run_id}}/DONE",
    output:
        f"{OUT}/crosscheck/lighteval/{{run_id}}/step_{{step}}/{{bench}}.results.json",
    params:
        script=f"{workflow.basedir}/eval/lighteval/run.py",
        python=LIGHTEVAL_PYTHON,
        args=lambda wc: crosscheck_run_args(SWEEP, wc.run_id, int(wc.step), wc.bench),
    conda:
        f"../envs/lighteval-{LIGHTEVAL_BACKEND}.yaml"
    log:
        f"{OUT}/logs/crosscheck/{{run_id}}/step_{{step}}_{{bench}}.log",
    benchmark:
        f"{OUT}/benchmarks/crosscheck/{{run_id}}/step_{{step}}_{{bench}}.tsv"
    threads: SWEEP.resources.evaluate.cpus
    resources:
        gpu=SWEEP.resources.evaluate.gpus,
        mem_mb=SWEEP.resources.evaluate.mem_mb,
        runtime=runtime("evaluate"),
    shell:
        "{params.python} {params.script} {params.args}"
        " --benchmark-dir $(dirname {input.benchmark}) --out {output} > {log} 2>&1"


rule lighteval_summary:
    input:
        results=rules.lighteval.output[0],
        benchmark=f"{OUT}/crosscheck/benchmarks/{{bench}}/{{bench}}.jsonl",
    output:
        f"{OUT}/crosscheck/lighteval/{{run_id}}/step_{{step}}/{{bench}}.json",
    params:
        checkpoint=lambda wc: f"{OUT}/runs/{wc.run_id}/checkpoints/step_{wc.step}",
        template=SWEEP.eval.template,
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/crosscheck/{{run_id}}/step_{{step}}_{{bench}}_summary.log",
    shell:
        "python -m eval.lighteval_convert convert {input.results} --out {output}"
        " --benchmark {wildcards.bench} --step {wildcards.step} --benchmark-file {input.benchmark}"
        " --template {params.template} --checkpoint {params.checkpoint} > {log} 2>&1"


rule concordance:
    input:
        ours=[
            f"{OUT}/runs/{run_id}/eval/step_{step}/{bench}.json"
            for run_id in RUN_IDS
            for step in CROSSCHECK_STEPS
            for bench in BENCHES
        ],
        lighteval=CROSSCHECK,
    output:
        table=report(f"{OUT}/crosscheck/concordance.md", caption="../report/concordance.rst",
                     category="Cross-check"),
        csv=f"{OUT}/crosscheck/concordance.csv",
    params:
        sweep_dir=lambda wc, output: os.path.dirname(os.path.dirname(output.table)),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/crosscheck/concordance.log",
    shell:
        "python -m analysis.concordance --sweep-dir {params.sweep_dir} > {log} 2>&1"
