# The cross-check stage (eval.crosscheck: [lighteval]): lighteval re-evaluates the chosen
# checkpoints (eval.crosscheck_steps, the last by default) on the same problems, prompts and
# sampling settings, in its own environment; analysis.concordance compares it with ours.
# Without eval.crosscheck the lists below are empty and none of these rules is in the DAG.
from snakemake.settings.types import DeploymentMethod

from common.layout import env_dir
from sweep.crosscheck import crosscheck_export_args, crosscheck_run_args

CROSSCHECK_STEPS = SWEEP.eval.crosscheck_at if "lighteval" in SWEEP.eval.crosscheck else []
LIGHTEVAL_BACKEND = SWEEP.eval.backend  # hf: transformers (CPU or GPU); vllm: GPU
# One environment per backend for every sweep under results_dir, built once.
LIGHTEVAL_ENV = str(env_dir(SWEEP.results_dir, f"lighteval-{LIGHTEVAL_BACKEND}"))
# With --software-deployment-method conda, Snakemake builds the env from the yaml instead.
LIGHTEVAL_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
LIGHTEVAL_PYTHON = "python" if LIGHTEVAL_CONDA else f"{LIGHTEVAL_ENV}/bin/python"
CC = LAYOUT.crosscheck
CROSSCHECK = [
    str(CC.summary(run_id, step, bench))
    for run_id in RUN_IDS
    for step in CROSSCHECK_STEPS
    for bench in BENCHES
]
CONCORDANCE = [str(CC.concordance_md)] if CROSSCHECK else []


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
        f"{LIGHTEVAL_ENV}.log",
    benchmark:
        f"{LIGHTEVAL_ENV}.tsv"
    shell:
        "python -m eval.lighteval_convert build-env --requirements {input.requirements}"
        " --out {output} > {log} 2>&1"


# The problems `python -m eval` evaluates (same file or generator, same limit), with the
# user message rendered by our template: what lighteval's task reads.
rule crosscheck_benchmark:
    output:
        str(CC.benchmark("{bench}")),
    params:
        args=lambda wc: crosscheck_export_args(SWEEP, wc.bench),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("crosscheck", "benchmark_{bench}")),
    shell:
        "python -m eval.lighteval_convert export {params.args} --out {output} > {log} 2>&1"


rule lighteval:
    input:
        env=[] if LIGHTEVAL_CONDA else [LIGHTEVAL_ENV],
        benchmark=str(CC.benchmark("{bench}")),
        done=str(RUN.done),
    output:
        str(CC.results("{run_id}", "{step}", "{bench}")),
    params:
        script=f"{workflow.basedir}/eval/lighteval/run.py",
        python=LIGHTEVAL_PYTHON,
        args=lambda wc: crosscheck_run_args(SWEEP, wc.run_id, int(wc.step), wc.bench),
    conda:
        f"../envs/lighteval-{LIGHTEVAL_BACKEND}.yaml"
    log:
        str(LAYOUT.log("crosscheck", "{run_id}", "step_{step}_{bench}")),
    benchmark:
        str(LAYOUT.benchmark("crosscheck", "{run_id}", "step_{step}_{bench}"))
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
        benchmark=str(CC.benchmark("{bench}")),
    output:
        str(CC.summary("{run_id}", "{step}", "{bench}")),
    params:
        checkpoint=lambda wc: str(LAYOUT.run(wc.run_id).checkpoint(wc.step)),
        template=SWEEP.eval.template,
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("crosscheck", "{run_id}", "step_{step}_{bench}_summary")),
    shell:
        "python -m eval.lighteval_convert convert {input.results} --out {output}"
        " --benchmark {wildcards.bench} --step {wildcards.step} --benchmark-file {input.benchmark}"
        " --template {params.template} --checkpoint {params.checkpoint} > {log} 2>&1"


rule concordance:
    input:
        ours=[
            str(LAYOUT.run(run_id).eval_summary(step, bench))
            for run_id in RUN_IDS
            for step in CROSSCHECK_STEPS
            for bench in BENCHES
        ],
        lighteval=CROSSCHECK,
    output:
        table=report(str(CC.concordance_md), caption="../report/concordance.rst",
                     category="Cross-check"),
        csv=str(CC.concordance_csv),
    params:
        # derived from the output (Snakemake's lint): <sweep>/crosscheck/concordance.md
        sweep_dir=lambda wc, output: os.path.dirname(os.path.dirname(output.table)),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("crosscheck", "concordance")),
    shell:
        "python -m analysis.concordance --sweep-dir {params.sweep_dir} > {log} 2>&1"
