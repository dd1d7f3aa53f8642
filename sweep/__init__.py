"""Sweeps: a declarative grid (config/*.yaml) -> cells -> trainer run configs.

The Snakemake workflow is a thin shell around this package: it validates the sweep with
the JSON schema, calls `expand` once at parse time and hands each job its run config.
"""

from .expand import Cell, expand
from .spec import SweepConfig, SweepError, load_sweep, parse_sweep

__all__ = ["Cell", "SweepConfig", "SweepError", "expand", "load_sweep", "parse_sweep"]
