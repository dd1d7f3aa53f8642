# Local rules: the exact-gradient audit, the paper's Figures 2/3, then tables, plots, report.


localrules:
    audit,
    paper_figures,
    report,


rule audit:
    output:
        table=f"{OUT}/audit/audit.md",
        csv=f"{OUT}/audit/audit.csv",
    log:
        f"{OUT}/logs/audit.log",
    benchmark:
        f"{OUT}/benchmarks/audit.tsv"
    shell:
        "python -m algorithms.audit --out $(dirname {output.table}) > {log} 2>&1"


rule paper_figures:
    output:
        f"{OUT}/paper/figure2_dual_clip.png",
        f"{OUT}/paper/figure3_rpg_style_clip.png",
    log:
        f"{OUT}/logs/paper_figures.log",
    benchmark:
        f"{OUT}/benchmarks/paper_figures.tsv"
    shell:
        "python -m analysis figures --out $(dirname {output[0]}) > {log} 2>&1"


rule report:
    input:
        evals=EVALS,
        audit=rules.audit.output.table,
        figures=rules.paper_figures.output,
    output:
        REPORT,
    params:
        sweep_dir=OUT,
        paper=lambda wc: report_paper_args(SWEEP),
    log:
        f"{OUT}/logs/report.log",
    benchmark:
        f"{OUT}/benchmarks/report.tsv"
    shell:
        "python -m analysis report --sweep-dir {params.sweep_dir} --out {params.sweep_dir}"
        " --audit-dir $(dirname {input.audit}) --figures-dir $(dirname {input.figures[0]})"
        " {params.paper} > {log} 2>&1"
