"""Security tests reuse the workflow tests' Snakemake runner (tests/workflow/workflow_helpers.py)."""

import sys
from pathlib import Path

WORKFLOW_TESTS = Path(__file__).resolve().parents[1] / "workflow"
if str(WORKFLOW_TESTS) not in sys.path:
    sys.path.insert(0, str(WORKFLOW_TESTS))
