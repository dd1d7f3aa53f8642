# Local rules: the exact-gradient audit, the paper's Figures 2/3, then tables, plots, report.


localrules:
    audit,
    paper_figures,
    report,
    mlflow_sync,


rule audit:
    output:
        table=str(LAYOUT.audit / "audit.md"),
        csv=str(LAYOUT.audit / "audit.csv"),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("audit")),
    benchmark:
        str(LAYOUT.benchmark("audit"))
    shell:
        "python -m algorithms.audit --out $(dirname {output.table}) > {log} 2>&1"


rule paper_figures:
    output:
        fig2=str(LAYOUT.paper / "figure2_dual_clip.png"),
        fig3=str(LAYOUT.paper / "figure3_rpg_style_clip.png"),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("paper_figures")),
    benchmark:
        str(LAYOUT.benchmark("paper_figures"))
    shell:
        "python -m analysis figures --out $(dirname {output.fig2}) > {log} 2>&1"


rule report:
    input:
        evals=EVALS,
        initial=INITIAL_EVALS,
        audit=rules.audit.output.table,
        figures=rules.paper_figures.output.fig2,
        concordance=CONCORDANCE,  # eval.crosscheck: the report's concordance section
    output:
        REPORT,
    params:
        sweep_dir=lambda wc, output: os.path.dirname(output[0]),
        paper=lambda wc: report_paper_args(SWEEP),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("report")),
    benchmark:
        str(LAYOUT.benchmark("report"))
    shell:
        "python -m analysis report --sweep-dir {params.sweep_dir} --out {params.sweep_dir}"
        " --audit-dir $(dirname {input.audit}) --figures-dir $(dirname {input.figures})"
        " {params.paper} > {log} 2>&1"


# Only in the DAG when a run holds mlflow_pending (see common.smk, SYNC_STAMPS).
rule mlflow_sync:
    input:
        REPORT,
    output:
        touch(str(LAYOUT.sync_stamp("{digest}"))),
    wildcard_constraints:
        digest=r"[0-9a-f]+",
    params:
        sweep_dir=lambda wc, input: os.path.dirname(input[0]),
        uri=SWEEP.mlflow_uri,
        experiment=SWEEP.experiment,
        parent=str(LAYOUT.parent_run_id),
    conda:
        "../envs/harness.yaml"
    log:
        str(LAYOUT.log("mlflow_sync", "{digest}")),
    shell:
        "python -m sweep mlflow-sync --sweep-dir {params.sweep_dir} --uri {params.uri:q}"
        " --experiment {params.experiment:q} --parent-run-id-file {params.parent} > {log} 2>&1"
