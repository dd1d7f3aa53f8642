"""The one-node SLURM cluster fixture (see slurm_cluster.py), shared by every SLURM test."""

import pytest
from slurm_cluster import PACKAGES, SlurmCluster, missing_programs


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing:
        pytest.skip(f"SLURM tests need {', '.join(missing)}: "
                    f"apt-get install -y {PACKAGES} (.ci/run does)")
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()
