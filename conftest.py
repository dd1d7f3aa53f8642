"""How `pytest -n 2` (pyproject's addopts; pytest-xdist) splits the suite between workers.

A work unit is one test file, so a module's fixtures (a finished micro sweep, a started
vLLM engine) are built once, in one worker. Files that use one machine-wide thing go to
the same worker as one unit: the one-node SLURM cluster, the vLLM CPU engines (each binds
its threads to the cores) and the checkout's own directory (Snakemake runs in it). The
longest units start first, so that the other worker takes the rest in the meantime; most
of the SLURM drills' time is spent waiting on SLURM, not computing.
`pytest -n 0` runs everything in one process, in file order.

At the repository root, not in tests/: a conftest's folder goes on sys.path, and tests/ holds
folders named like the packages (tests/algorithms, ...) that would shadow them.
"""

from __future__ import annotations

# Units named by a path prefix; the files under one prefix run together, in this order
# (the first the longest: its wait overlaps the most of the rest).
SHARED_UNITS = {
    "tests/slurm/": "slurm",
    "tests/vllm/": "vllm",
    "tests/workflow/test_workflow_dryrun.py": "checkout",
    "tests/workflow/test_tiny_model_shipped.py": "checkout",
    "tests/crosscheck/test_crosscheck_dryrun.py": "checkout",
    "tests/crosscheck/test_crosscheck_e2e.py": "checkout",
}
# Single files known to take minutes, started right after the shared units.
LONG_FILES = (
    "tests/workflow/test_workflow_e2e.py",
    "tests/reliability/test_mlflow_drills.py",
    "tests/security/test_mlflow_auth_server.py",
    "tests/workflow/test_readme_snapshot.py",
    "tests/distributed/test_fsdp_cpu.py",
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its shared unit's name, else its file."""
    path = nodeid.split("::", 1)[0]
    for prefix, unit in SHARED_UNITS.items():
        if path.startswith(prefix):
            return unit
    return path


def start_rank(unit: str) -> int:
    """Earlier units start first: the shared ones, then the long files, then the rest."""
    order = [*dict.fromkeys(SHARED_UNITS.values()), *LONG_FILES]
    return order.index(unit) if unit in order else len(order)


def pytest_configure(config):
    """An xdist worker computes in-process on one intra-op thread: two workers share two
    cores (a one-process run had one thread anyway from tests/algorithms on, whose session
    fixture sets it). Subprocesses (the trainer, Snakemake jobs) choose their own."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (whose own `dist` option reads "no"): the longest units first (a
    stable sort: files stay whole and in order), the order the scheduler hands them out in."""
    if hasattr(config, "workerinput"):
        ranks = {id(item): start_rank(unit_of(item.nodeid)) for item in items}
        items.sort(key=lambda item: ranks[id(item)])


def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with our units, handed out in collection order (not xdist's
    most-tests-first)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return ByUnit(config, log)
