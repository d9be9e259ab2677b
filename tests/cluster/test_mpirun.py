"""`hetjax train --launcher mpirun`: Open MPI MPMD, one app context per island."""

from tests.cluster.engine_runs import FLAGS, assert_same_losses
from tests.train_runs import start_train

# Two processes on a 2-core machine: more than its slots by Open MPI's count.
MPIRUN_ARGS = {"HETJAX_MPIRUN_ARGS": "--oversubscribe"}


def test_mpirun_mpmd_equals_the_local_run(mpirun, local_reference, tmp_path):
    engine = start_train(tmp_path / "mpirun", *FLAGS, "--launcher", "mpirun", env=MPIRUN_ARGS)
    assert_same_losses(engine, local_reference)


def test_mpirun_two_islands_of_two_processes(mpirun, local_reference, tmp_path):
    islands = ("--islands", "cpu*2/2,cpu*2/2")
    engine = start_train(tmp_path / "mpirun", *FLAGS, *islands, "--launcher", "mpirun", env=MPIRUN_ARGS)
    assert_same_losses(engine, local_reference)
