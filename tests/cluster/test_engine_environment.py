"""A worker's HETJAX_* variables derived from fake SLURM and Open MPI
environments (hetjax/engines), table by table: rank, world size, island,
process in the island, coordinators, secret, and what jax's own cluster
detection then sees."""

import os
from unittest import mock

import pytest

from hetjax.cluster import Island
from hetjax.engines import EngineError, derive, job_ports
from hetjax.engines.slurm import first_host, srun_command

ATTEMPT = "0123456789abcdef"
# islands a (2 processes) and b (1): ranks 0, 1 = a/0, a/1; rank 2 = b/0.
ISLANDS = [Island("a", "cpu", devices=2, processes=2), Island("b", "cpu", processes=1)]
RENDEZVOUS, (PORT_A, PORT_B) = job_ports(ATTEMPT, 2)


def slurm_task(procid: int, **extra) -> dict[str, str]:
    """A task of `srun -n2 ... : -n1 ...` in a het allocation n1 (2 tasks) + n[2-3] (1)."""
    env = {
        "SLURM_JOB_ID": "40",
        "SLURM_STEP_ID": "0",
        "SLURM_HET_SIZE": "2",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "3",
        "SLURM_STEP_NODELIST": "n[1-3]",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "n1",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "n[2-3]",
        "SLURM_JOB_NUM_NODES_HET_GROUP_0": "1",
        "SLURM_JOB_NUM_NODES_HET_GROUP_1": "2",
        "SLURM_JOB_ID_HET_GROUP_0": "40",
        "SLURM_JOB_ID_HET_GROUP_1": "41",
        "SLURM_NTASKS_HET_GROUP_0": "2",
        "SLURM_NTASKS_HET_GROUP_1": "1",
    }
    return {**env, **extra}


def mpi_process(rank: int, app: int, **extra) -> dict[str, str]:
    """A process of `mpirun -np 2 ... : -np 1 ...` on two nodes."""
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
        "OMPI_APP_CTX_NUM_PROCS": "2 1",
        "OMPI_MCA_orte_app_num": str(app),
        "OMPI_MCA_orte_num_nodes": "2",
        "OMPI_MCA_orte_hnp_uri": "1390673920.0;tcp://10.1.2.3,192.0.2.2:51827",
    }
    return {**env, **extra}


# (environment, rank, island, process, rendezvous coordinator, island coordinator)
CASES = [
    (slurm_task(0), 0, "a", 0, f"n1:{RENDEZVOUS}", f"n1:{PORT_A}"),
    (slurm_task(1), 1, "a", 1, f"n1:{RENDEZVOUS}", f"n1:{PORT_A}"),
    (slurm_task(2), 2, "b", 0, f"n1:{RENDEZVOUS}", f"n2:{PORT_B}"),
    (slurm_task(2, HETJAX_COORDINATOR="login:7000"), 2, "b", 0, "login:7000", f"n2:{PORT_B}"),
    (slurm_task(1, HETJAX_ISLAND_COORDINATOR="n1:9999"), 1, "a", 1, f"n1:{RENDEZVOUS}", "n1:9999"),
    (mpi_process(0, 0), 0, "a", 0, f"10.1.2.3:{RENDEZVOUS}", f"10.1.2.3:{PORT_A}"),
    (mpi_process(2, 1), 2, "b", 0, f"10.1.2.3:{RENDEZVOUS}", f"127.0.0.1:{PORT_B}"),
    (mpi_process(1, 0, OMPI_MCA_orte_num_nodes="1"), 1, "a", 1, f"127.0.0.1:{RENDEZVOUS}", f"127.0.0.1:{PORT_A}"),
]


@pytest.mark.parametrize("environ, rank, island, process, rendezvous, island_coordinator", CASES)
def test_derived_variables(tmp_path, monkeypatch, environ, rank, island, process, rendezvous, island_coordinator):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the session's own (tests/compile_cache.py)
    (tmp_path / "secret").write_text("s")
    env = derive(environ, ISLANDS, ATTEMPT, tmp_path)
    assert env["HETJAX_RANK"] == str(rank) and env["HETJAX_WORLD_SIZE"] == "3"
    assert env["HETJAX_ISLAND"] == island and env["HETJAX_ISLAND_PROCESS"] == str(process)
    assert env["HETJAX_ISLAND_PROCESSES"] == str(2 if island == "a" else 1)
    assert env["HETJAX_COORDINATOR"] == rendezvous
    assert env["HETJAX_ISLAND_COORDINATOR"] == env["JAX_COORDINATOR_ADDRESS"] == island_coordinator
    assert env["HETJAX_SECRET_FILE"] == str(tmp_path / "secret") and "HETJAX_SECRET" not in env
    assert env["HETJAX_JOB_ID"] == ATTEMPT
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count={2 if island == 'a' else 1}"


def test_jax_slurm_detection_sees_one_island(tmp_path):
    """jax.distributed's own SLURM detection, run on a derived environment,
    finds the island's processes, not the het step's."""
    from jax._src.clusters.slurm_cluster import SlurmCluster

    (tmp_path / "secret").write_text("s")
    for procid, count, process, nodes in ((1, 2, 1, "n1"), (2, 1, 0, "n[2-3]")):
        env = derive(slurm_task(procid), ISLANDS, ATTEMPT, tmp_path)
        with mock.patch.dict(os.environ, env, clear=True):
            assert SlurmCluster.is_env_present()
            assert (SlurmCluster.get_process_count(), SlurmCluster.get_process_id()) == (count, process)
            assert os.environ["SLURM_STEP_NODELIST"] == nodes


def test_gpu_islands_keep_the_engines_devices_unless_named(tmp_path):
    (tmp_path / "secret").write_text("s")
    named = [Island("nv", "cuda", devices=2, device_ids=(2, 3)), Island("amd", "rocm", devices=2)]
    one = {**slurm_task(0), "SLURM_NTASKS": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    env = derive(one, named, ATTEMPT, tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["JAX_LOCAL_DEVICE_IDS"] == "0,1"
    two = {**slurm_task(1), "SLURM_NTASKS": "2", "HIP_VISIBLE_DEVICES": "4,5"}
    assert derive(two, named, ATTEMPT, tmp_path)["HIP_VISIBLE_DEVICES"] == "4,5"


@pytest.mark.parametrize(
    "environ, message",
    [
        ({}, "started without HETJAX_RANK and outside SLURM"),
        (slurm_task(0, SLURM_HET_SIZE="3"), "the SLURM job has 3 het component(s), the job 2 islands (a, b)"),
        (
            slurm_task(0, SLURM_NTASKS="2"),
            "the SLURM step runs 2 tasks, the job's islands hold 3 processes (a: 2, b: 1)",
        ),
        (
            mpi_process(0, 0, OMPI_APP_CTX_NUM_PROCS="1 2"),
            "app contexts of [1, 2] processes, the job's islands need [2, 1]",
        ),
        (mpi_process(0, 0, OMPI_COMM_WORLD_SIZE="4", OMPI_APP_CTX_NUM_PROCS=""), "mpirun started 4 processes"),
        (mpi_process(2, 0), "rank 2 is in app context 0, but the job's layout puts it in island 1"),
    ],
)
def test_engine_mismatches_are_named(tmp_path, environ, message):
    (tmp_path / "secret").write_text("s")
    with pytest.raises(EngineError) as e:
        derive(environ, ISLANDS, ATTEMPT, tmp_path)
    assert message in str(e.value)


def test_missing_secret_file_is_named(tmp_path):
    with pytest.raises(EngineError, match=f"expected {tmp_path / 'secret'}"):
        derive(slurm_task(0), ISLANDS, ATTEMPT, tmp_path)


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("n1", "n1"),
        ("n1,n2", "n1"),
        ("n[01-04,07],m1", "n01"),
        ("node[7,9]", "node7"),
        ("rack[1-2]-gpu[3-4]", "rack1-gpu3"),
    ],
)
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert first_host(nodelist) == host


def test_srun_runs_one_het_group_per_island():
    assert srun_command(ISLANDS, ["w"]) == [
        "srun", "--kill-on-bad-exit=1", "--label", "--het-group=0", "--ntasks=2", "w", ":", "--het-group=1", "--ntasks=1", "w",
    ]  # fmt: skip
