# The embedded default's policy: a tiny HF model built and warm-started locally (CPU, offline).


rule tiny_model:
    output:
        directory(MODEL_DIR),
    params:
        args=SWEEP.tiny.cli_args(),
    conda:
        "../envs/harness.yaml"
    log:
        f"{OUT}/logs/tiny_model.log",
    benchmark:
        f"{OUT}/benchmarks/tiny_model.tsv"
    shell:
        "python -m trainer tiny --out {output} {params.args} > {log} 2>&1"
