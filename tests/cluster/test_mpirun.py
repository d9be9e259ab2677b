"""`hetjax train --launcher mpirun`: Open MPI MPMD, one app context per island."""

from tests.cluster.engine_runs import FLAGS, assert_same_losses
from tests.train_runs import start_train

# Three processes on a 2-core machine: more than its slots by Open MPI's count.
MPIRUN_ARGS = {"HETJAX_MPIRUN_ARGS": "--oversubscribe"}


def test_mpirun_mpmd_of_a_two_process_island_and_a_one_process_island_equals_the_plain_loop(
    mpirun, local_reference, tmp_path
):
    """App context 0's two processes form island 0's jax.distributed
    cluster, app context 1's one process island 1 (each its own rows over
    the bridge); the losses are the plain loop's."""
    islands = ("--islands", "cpu*2/2,cpu")
    engine = start_train(tmp_path / "mpirun", *FLAGS, *islands, "--launcher", "mpirun", env=MPIRUN_ARGS)
    assert_same_losses(engine, local_reference)
