"""Sweep CLI: inspect a grid, write run configs, keep the JSON schema in sync.

    python -m sweep cells config/default.yaml            # the cells, run ids and notes
    python -m sweep schema > workflow/schemas/sweep.schema.json
    python -m sweep mlflow-sync --sweep-dir results/default --uri sqlite:///results/default/mlflow.db \
        --experiment default                            # attach runs MLflow missed (rc 0 always)
"""

from __future__ import annotations

import argparse
import json
import sys

from common.files import read_run_id

from .checks import check_inputs
from .expand import expand
from .spec import SweepConfig, SweepError, load_sweep
from .tracking import sync_pending


def schema() -> dict:
    """The JSON schema Snakemake validates sweep configs with (generated, never hand-edited)."""
    out = SweepConfig.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cells = sub.add_parser("cells", help="list the cells of a sweep config")
    cells.add_argument("config")
    sub.add_parser("schema", help="print the sweep JSON schema")
    sync = sub.add_parser("mlflow-sync", help="attach runs whose jobs could not reach MLflow")
    sync.add_argument("--sweep-dir", required=True, help="results/<sweep> (holds runs/)")
    sync.add_argument("--uri", required=True, help="the sweep's tracking URI")
    sync.add_argument("--experiment", required=True)
    sync.add_argument("--parent-run-id-file", default=None, help="the invocation's parent run")
    args = parser.parse_args(argv)
    if args.cmd == "schema":
        print(json.dumps(schema(), indent=2, sort_keys=True))
        return 0
    if args.cmd == "mlflow-sync":
        return _sync(args)
    try:
        sweep = load_sweep(args.config)
        found, notes = expand(sweep, args.config)
        check_inputs(sweep, found, args.config)
    except SweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cell in found:
        print(f"{cell.run_id}\t{cell.label}")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{len(found)} runs", file=sys.stderr)
    return 0


def _sync(args) -> int:
    attached, failed = sync_pending(args.sweep_dir, args.uri, args.experiment,
                                    read_run_id(args.parent_run_id_file))
    print(f"MLflow sync: {len(attached)} run(s) attached {attached}; "
          f"{len(failed)} still pending {failed}")
    return 0


if __name__ == "__main__":
    from common.console import line_buffered_stdout

    line_buffered_stdout()  # its log shows each line when printed
    raise SystemExit(main())
