# The embedded default's policy: a tiny HF model built and warm-started locally (CPU, offline).


rule tiny_model:
    output:
        directory(MODEL_DIR),
    params:
        args=SWEEP.tiny.cli_args(),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("tiny_model")),
    benchmark:
        str(LAYOUT.benchmark("tiny_model"))
    shell:
        "python -m trainer tiny --out {output} {params.args} > {log} 2>&1"
