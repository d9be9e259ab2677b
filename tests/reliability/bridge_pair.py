"""Two bridge ranks on this machine without the launcher: what the reliability
tests start when they kill, freeze or starve one rank and watch the other."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from hetjax.launch import free_port


def pair_env(**settings: str) -> dict[str, str]:
    """The environment of a two-rank CPU bridge job (rank and island aside), plus `settings`."""
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "HETJAX_WORLD_SIZE": "2",
        "HETJAX_COORDINATOR": f"127.0.0.1:{free_port()}",
        "HETJAX_SECRET": secrets.token_hex(16),
        **settings,
    }


def start_pair(argv: list[str], env: dict[str, str], **popen) -> list[subprocess.Popen]:
    """Ranks 0 and 1 running `python argv`, output (stderr included) on their stdout pipes."""
    return [
        subprocess.Popen(
            [sys.executable, *argv],
            env={**env, "HETJAX_RANK": str(r), "HETJAX_ISLAND": f"isle{r}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **popen,
        )
        for r in (0, 1)
    ]


def run_pair(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[list[int], list[str]]:
    """Both ranks to the end: (exit codes, outputs); whatever is left after `timeout_s` is killed."""
    procs = start_pair(argv, env)
    try:
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [p.returncode for p in procs], outputs
