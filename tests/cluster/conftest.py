"""Engines for the cluster tests: a SLURM cluster of this machine (one per
session, slurm_cluster.py) and Open MPI's mpirun. A test that needs an
engine skips, saying why, only when the engine cannot run here."""

import shutil

import pytest

from tests.cluster.engine_runs import LocalReference
from tests.cluster.slurm_cluster import SlurmCluster, missing_tools

# Every engine test runs the same tiny job: its stage programs compile once
# (tests/conftest.py shares one compilation cache with every process).


@pytest.fixture(scope="session")
def slurm():
    missing = missing_tools()
    if missing:
        pytest.skip(f"SLURM is not installed (no {', '.join(missing)}): scripts/install.sh --test installs it")
    cluster = SlurmCluster()
    try:
        cluster.start()
    except RuntimeError as e:
        cluster.stop()
        pytest.skip(f"SLURM cannot start on this machine: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed (no mpirun): scripts/install.sh --test installs it")
    return shutil.which("mpirun")


@pytest.fixture(scope="session")
def local_reference() -> LocalReference:
    """The losses of the engine tests' job by the plain loop, once for all engines."""
    return LocalReference()
