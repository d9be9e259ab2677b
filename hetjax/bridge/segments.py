"""Names of a job's shared-memory segments in /dev/shm, and their removal.

Every shm ring and GPU slot ring of a job is named ``/hetjax-<job>-...``.
The opening end unlinks a name as soon as it has mapped the segment, so a
running job keeps nothing in /dev/shm; only a process killed during start-up,
between creating a segment and its peer opening it, can leave one behind.
Whoever outlives the job and knows its id (the launcher) removes those.
"""

from __future__ import annotations

import os
import re
import secrets

SHM_DIR = "/dev/shm"
_JOB_ID = re.compile(r"^[A-Za-z0-9]{1,32}$")


def new_job_id() -> str:
    return secrets.token_hex(6)


def check_job_id(job_id: str) -> str:
    """A job id that is safe inside a segment name (no '/', no '-')."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r}: expected 1-32 letters or digits")
    return job_id


def job_prefix(job_id: str) -> str:
    """The file-name prefix of every segment of this job in /dev/shm."""
    return f"hetjax-{check_job_id(job_id)}-"


def segment_names(nonce: str, me: int, peer: int, kind: str = "") -> tuple[str, str]:
    """(outbound, inbound) segment names of the link between two ranks;
    `kind` tells apart several segments per link ("gpu")."""
    middle = f"{kind}-" if kind else ""
    return f"/hetjax-{nonce}-{middle}{me}-{peer}", f"/hetjax-{nonce}-{middle}{peer}-{me}"


def job_segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    prefix = job_prefix(job_id)
    try:
        return sorted(n for n in os.listdir(shm_dir) if n.startswith(prefix))
    except FileNotFoundError:  # no /dev/shm: nothing of ours can be there
        return []


def remove_job_segments(job_id: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlinks every segment of the job; returns the names removed."""
    removed = []
    for name in job_segments(job_id, shm_dir):
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:  # its owner unlinked it meanwhile
            pass
    return removed


def remove_named(names) -> None:
    """Best-effort unlink of segment names ("/hetjax-..."), for a rank whose
    start-up failed: the peer that should have opened them may be dead."""
    for name in names:
        if name:
            try:
                os.unlink(SHM_DIR + name)
            except OSError:
                pass
