# Validate the sweep and expand it into cells, once, before any job is scheduled.
import glob
import json
import re
import sys

from snakemake.utils import validate

from common.layout import SweepDir
from sweep import SweepError, parse_sweep
from sweep import expand as expand_sweep  # snakemake's own `expand` stays usable
from sweep.checks import check_inputs
from sweep.runconfig import (
    eval_args,
    eval_argv,
    initial_eval_args,
    initial_model,
    model_dir,
    report_paper_args,
    run_config,
    run_config_yaml,
    segment_steps,
    train_command,
    train_slurm_resources,
)
from sweep.tracking import pending_digest, pending_runs

SOURCE = ", ".join(map(str, workflow.overwrite_configfiles)) or "config/default.yaml"
try:
    SWEEP = parse_sweep(config, SOURCE)  # names the file, the key and the allowed values
    CELLS, NOTES = expand_sweep(SWEEP, SOURCE)
    check_inputs(SWEEP, CELLS, SOURCE)  # files, model path, every cell's run config
except SweepError as exc:
    sys.exit(f"error: {exc}")
validate(config, schema="../schemas/sweep.schema.json", set_default=False)
for note in NOTES:
    print(f"sweep note: {note}", file=sys.stderr)

OUT = str(SWEEP.out_dir)
LAYOUT = SweepDir(OUT)  # every path below comes from common.layout
RUN = LAYOUT.run("{run_id}")  # a run directory, as a wildcard pattern
RUNS = {cell.run_id: cell for cell in CELLS}
RUN_IDS = list(RUNS)
SEEDS_TOGETHER = SWEEP.resources.train.seeds_together
CELL_RUNS = {}  # cell name -> its run ids in seed order (run id = <cell>_s<seed>)
for _cell in CELLS:
    CELL_RUNS.setdefault(_cell.run_id.removesuffix(f"_s{_cell.seed}"), []).append(_cell.run_id)
STEPS = SWEEP.eval.steps
SEGMENTS = segment_steps(SWEEP)  # eval.group checkpoint: train in segments up to these steps
EVAL_IN_TRAIN = SWEEP.eval.group == "train"  # the train job evaluates its run (sweep/job.py)
BENCHES = SWEEP.eval.benchmarks
MODEL_DIR = str(LAYOUT.model)
# the folder a job's model comes from when the workflow makes it (the tiny model, or a named
# pretrained model converted once: rule prepare_model); [] for the user's folder or hub id
MADE_MODEL = model_dir(SWEEP)
MODEL_INPUT = [str(MADE_MODEL)] if MADE_MODEL is not None else []

wildcard_constraints:
    run_id="|".join(RUN_IDS),
    step=r"\d+",
    bench="|".join(BENCHES),

EVALS = [
    str(LAYOUT.run(run_id).eval_summary(step, bench))
    for run_id in RUN_IDS
    for step in STEPS
    for bench in BENCHES
]
REPORT = str(LAYOUT.report)
# The initial model (step 0) once per benchmark: the report's baseline row. Only for a
# local model (the tiny default or a directory); a hub id is not a checkpoint directory.
INITIAL_EVALS = (
    [str(LAYOUT.initial.eval_summary(0, bench)) for bench in BENCHES]
    if SWEEP.eval.initial and initial_model(SWEEP) is not None
    else []
)
# Runs whose jobs could not reach MLflow (docs/reliability.md): this invocation
# attaches them (rule mlflow_sync) after the report. The stamp is named by the pending notes'
# content, and a failed sync appends to them, so each invocation with something pending
# runs the sync again.
PENDING = pending_runs(OUT) if SWEEP.mlflow.enabled else []
SYNC_STAMPS = [str(LAYOUT.sync_stamp(pending_digest(PENDING)))] if PENDING else []
if PENDING:
    print(f"sweep note: {len(PENDING)} run(s) not yet in MLflow {[p.name for p in PENDING]}; "
          "rule mlflow_sync attaches them", file=sys.stderr)


def previous_segment(wildcards, before=None):
    """The segment marker a train job waits for: the last segment before its step."""
    earlier = [s for s in SEGMENTS if before is None or s < before]
    return [str(LAYOUT.run(wildcards.run_id).segment(earlier[-1]))] if earlier else []


def runtime(kind, checkpoints=0):
    """Minutes for a job of `kind`, plus `checkpoints` evaluations (resources.evaluate's
    runtime_min is per checkpoint); each retry gets proportionally more."""
    base = (getattr(SWEEP.resources, kind).runtime_min
            + checkpoints * SWEEP.resources.evaluate.runtime_min)
    return lambda wildcards, attempt: base * attempt


def cell_outputs():
    """seeds_together: the train job's outputs, every seed's (DONE and, with eval.group:
    train, its evaluations), as patterns of the `{cell}` wildcard."""
    out = {}
    for seed in SWEEP.seeds:
        run_id = f"{{cell}}_s{seed}"
        out[f"done_s{seed}"] = str(LAYOUT.run(run_id).done)
        if EVAL_IN_TRAIN:
            out.update({f"{k}_s{seed}": v for k, v in run_evals(run_id).items()})
    return out


def cell_runs_json(cell):
    """seeds_together: `python -m sweep.job --runs`'s list for a cell, in seed order."""
    runs = []
    for run_id in CELL_RUNS[cell]:
        train = ["--config", str(LAYOUT.run_config(run_id)),
                 "--parent-run-id-file", str(LAYOUT.parent_run_id)]
        runs.append({"log": str(LAYOUT.log("train", run_id)), "train": train,
                     "eval": eval_argv(SWEEP, run_id, STEPS, BENCHES) if EVAL_IN_TRAIN else None})
    return json.dumps(runs)


def run_evals(run_id="{run_id}", steps=None):
    """A run's evaluation outputs: summaries (flagged for `snakemake --report`) and samples."""
    steps = STEPS if steps is None else steps
    run = LAYOUT.run(run_id)
    return {"summaries": [summary_for_report(str(run.eval_summary(s, b)), b, s, run_id)
                          for s in steps for b in BENCHES],
            "samples": [str(run.eval_samples(s, b)) for s in steps for b in BENCHES]}


def _tracking_warning(message):
    print(f"sweep warning: {message}", file=sys.stderr)


# `snakemake --report` (report.smk, eval.smk): what each artefact is registered as, and why
# the report cannot be built yet.
def summary_for_report(path, bench, step, run="{run_id}"):
    """An evaluation summary flagged for `snakemake --report`: one category per benchmark,
    one subcategory per run, labelled by run and step."""
    return report(path, caption="../report/eval_summary.rst", category=f"Benchmark {bench}",
                  subcategory=run, labels={"run": run, "step": str(step)})


def report_requested(argv):
    """`snakemake --report FILE` (not --report-after-run, which builds it after the run).
    Snakemake tells the Snakefile nothing about --report, so its command line is read."""
    flags = [a.split("=")[0] for a in argv]
    return "--report" in flags and "--report-after-run" not in flags


def locked_by_a_run(sweep_dir):
    """The lock file of a running (or hard-killed) Snakemake that writes under sweep_dir."""
    root = os.path.abspath(sweep_dir) + os.sep
    for lock in sorted(glob.glob(".snakemake/locks/*.output.lock")):
        with open(lock) as handle:
            paths = [os.path.abspath(line.strip()) for line in handle if line.strip()]
        if any(p.startswith(root) for p in paths):
            return lock
    return None


def report_blocker(reported):
    """Why `--report` cannot build the study now (one line), or None when it can."""
    lock = locked_by_a_run(OUT)
    if lock is not None:
        return (f"{OUT} is being written by a Snakemake run (lock {os.path.abspath(lock)}): "
                "wait for it to finish, then rerun --report (after a killed run: "
                "snakemake --unlock first)")
    missing = [p for p in reported if not os.path.exists(p)]
    if missing:
        return (f"{OUT} is not finished: {len(missing)} of {len(reported)} files of the "
                f"report are missing (the first: {missing[0]}); run the sweep first "
                f"(snakemake -c all --configfile {SOURCE}; it resumes), then rerun --report")
    return None


# The parent run spans the invocation: created at onstart, ended at onsuccess/onerror.
onstart:
    from sweep.tracking import start_parent_run

    start_parent_run(SWEEP, LAYOUT.parent_run_id, on_error=_tracking_warning)


onsuccess:
    from sweep.tracking import end_parent_run

    end_parent_run(SWEEP, LAYOUT.parent_run_id, ok=True, on_error=_tracking_warning)


onerror:
    from sweep.tracking import end_parent_run

    end_parent_run(SWEEP, LAYOUT.parent_run_id, ok=False, on_error=_tracking_warning)
