# Local rules: the exact-gradient audit, the paper's Figures 2/3, then tables, plots, report.
# Every artefact is flagged with report() so `snakemake --report results/<sweep>/report.html`
# builds one self-contained HTML file of the study (captions: workflow/report/*.rst). Tables
# and plots are registered as their folders with a file pattern, so a new table or plot
# that `python -m analysis report` writes there is in the HTML report without a change here.


# Everything report() flags below, so an unfinished or running sweep is named before
# Snakemake builds the DAG (its own message names one missing file, after warnings).
REPORTED = [*EVALS, *INITIAL_EVALS, str(LAYOUT.audit / "audit.md"),
            str(LAYOUT.paper / "figure2_dual_clip.png"), REPORT, *CONCORDANCE]
if report_requested(sys.argv) and (blocker := report_blocker(REPORTED)):
    sys.exit(f"error: {blocker}")


localrules:
    audit,
    paper_figures,
    report,
    mlflow_sync,


rule audit:
    output:
        table=report(str(LAYOUT.audit / "audit.md"), caption="../report/audit.rst",
                     category="Audit", labels={"file": "audit.md"}),
        csv=report(str(LAYOUT.audit / "audit.csv"), caption="../report/audit.rst",
                   category="Audit", labels={"file": "audit.csv"}),
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
        fig2=report(str(LAYOUT.paper / "figure2_dual_clip.png"),
                    caption="../report/paper_figures.rst", category="Paper figures",
                    labels={"figure": "Figure 2"}),
        fig3=report(str(LAYOUT.paper / "figure3_rpg_style_clip.png"),
                    caption="../report/paper_figures.rst", category="Paper figures",
                    labels={"figure": "Figure 3"}),
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
        md=report(REPORT, caption="../report/report_md.rst", category="Report"),
        # written by the same command beside report.md (analysis/report.py)
        tables=report(directory(str(LAYOUT.tables)), caption="../report/tables.rst",
                      category="Tables", patterns=["{table}.{fmt}"],
                      labels={"table": "{table}", "format": "{fmt}"}),
        plots=report(directory(str(LAYOUT.plots)), caption="../report/plots.rst",
                     category="Plots", patterns=["{plot}.{fmt}"],
                     labels={"plot": "{plot}", "format": "{fmt}"}),
    params:
        sweep_dir=lambda wc, output: os.path.dirname(output.md),
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
