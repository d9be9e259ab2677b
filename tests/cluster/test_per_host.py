"""`hetjax launch --cluster FILE --host-index N`: each "host" (here two
loopback addresses of this machine) starts its own processes, and they
meet over the bridge with the job secret from a shared 0600 file."""

import subprocess
import sys

import yaml

from hetjax.cluster import load_cluster
from hetjax.engines.per_host import host_processes
from hetjax.launch import free_port

PING = "tests/bridge/workers/ping.py"


def write_cluster(path, hosts_a, hosts_b, processes_a=1):
    islands = [
        {"name": "a", "platform": "cpu", "hosts": hosts_a, "processes": processes_a},
        {"name": "b", "platform": "cpu", "hosts": hosts_b},
    ]
    path.write_text(yaml.safe_dump({"islands": islands}))
    return path


def test_processes_are_spread_over_their_hosts(tmp_path):
    islands = load_cluster(write_cluster(tmp_path / "c.yaml", ["h0", "h1"], ["h1"], processes_a=4))
    on_h1 = host_processes(islands, "h1", "/s", 5000)
    assert [(name, env["HETJAX_RANK"], env["HETJAX_ISLAND_PROCESS"]) for name, env in on_h1] == [
        ("a.2", "2", "2"),
        ("a.3", "3", "3"),
        ("b", "4", "0"),
    ]
    env = dict(on_h1)["b"]
    assert env["HETJAX_WORLD_SIZE"] == "5" and env["HETJAX_COORDINATOR"] == "h0:5000"
    assert env["HETJAX_ISLAND_COORDINATOR"] == "h1:5002" and env["HETJAX_SECRET_FILE"] == "/s"


def test_two_hosts_meet_over_the_bridge(tmp_path, repo_root):
    cluster = write_cluster(tmp_path / "c.yaml", ["127.0.0.1"], ["127.0.0.2"])
    secret = tmp_path / "secret"
    secret.write_text("a shared secret")
    secret.chmod(0o600)
    port = str(free_port())
    hosts = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hetjax.cli",
                "launch",
                "--cluster",
                str(cluster),
                "--host-index",
                str(n),
                "--secret-file",
                str(secret),
                "--port",
                port,
                "--timeout",
                "120",
                "--",
                sys.executable,
                PING,
            ],
            cwd=repo_root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for n in (0, 1)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in hosts]
    for n, (p, out) in enumerate(zip(hosts, outputs)):
        assert p.returncode == 0, out[-3000:]
        assert f"OK rank {n}" in out and f"host {n} (127.0.0.{n + 1}): {'ab'[n]}" in out
