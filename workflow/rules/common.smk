# Validate the sweep and expand it into cells, once, before any job is scheduled.
import sys

from snakemake.utils import validate

from sweep import SweepError, parse_sweep
from sweep import expand as expand_sweep  # snakemake's own `expand` stays usable
from sweep.runconfig import eval_args, report_paper_args, run_config

SOURCE = ", ".join(map(str, workflow.overwrite_configfiles)) or "config/default.yaml"
try:
    SWEEP = parse_sweep(config, SOURCE)  # names the file, the key and the allowed values
    CELLS, NOTES = expand_sweep(SWEEP, SOURCE)
except SweepError as exc:
    sys.exit(f"error: {exc}")
validate(config, schema="../schemas/sweep.schema.json", set_default=False)
for note in NOTES:
    print(f"sweep note: {note}", file=sys.stderr)

OUT = str(SWEEP.out_dir)
RUNS = {cell.run_id: cell for cell in CELLS}
RUN_IDS = list(RUNS)
STEPS = SWEEP.eval.steps
BENCHES = SWEEP.eval.benchmarks
TINY = SWEEP.base.get("model", {}).get("path", "tiny") == "tiny"
MODEL_DIR = f"{OUT}/model"

wildcard_constraints:
    run_id="|".join(RUN_IDS),
    step=r"\d+",
    bench="|".join(BENCHES),

EVALS = [
    f"{OUT}/runs/{run_id}/eval/step_{step}/{bench}.json"
    for run_id in RUN_IDS
    for step in STEPS
    for bench in BENCHES
]
REPORT = f"{OUT}/report.md"


def runtime(kind):
    """Minutes for a job of `kind`; each retry gets proportionally more."""
    base = getattr(SWEEP.resources, kind).runtime_min
    return lambda wildcards, attempt: base * attempt


onstart:
    from sweep.tracking import start_parent_run

    start_parent_run(SWEEP, f"{OUT}/mlflow_parent_run_id")
