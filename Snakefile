"""The RPG study as one DAG: tiny model -> train (cell x seed) -> evaluate (checkpoint x
benchmark) -> audit, paper figures -> tables, plots, report, all tracked in MLflow.

    snakemake -c all                                          # config/default.yaml, CPU
    snakemake --profile workflow/profiles/slurm --configfile config/paper.yaml
"""

from snakemake.utils import min_version

min_version("8.20")

# The default sweep is loaded only when no --configfile is given: Snakemake would otherwise
# deep-merge the default into the user's sweep. Several --configfile files merge in order,
# which is how overlays such as config/paper-4k.yaml switch a setting.
if not workflow.overwrite_configfiles:

    configfile: "config/default.yaml"


# `snakemake --report results/<sweep>/report.html`: the study in one HTML file (docs/reports.md).
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/crosscheck.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        REPORT,
        SYNC_STAMPS,
