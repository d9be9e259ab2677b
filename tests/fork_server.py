"""The test session's shared fork server (tests/conftest.py).

Every local launch of a test process joins one server that imported what a
`hetjax train` worker imports (HETJAX_FORK_SERVER=PATH, hetjax/forkserver.py):
a launch costs a fork instead of a server of its own importing jax, flax
and optax (1.5-2 CPU-s each, and the suite launches over a hundred).

A launch whose environment differs from the server's where the imports
read starts its workers fresh, which is correct but slow; and the tests'
own environment drifts (importing torch sets TORCHINDUCTOR_CACHE_DIR, a test
sets a variable for good). So before each module and each test, a server
started under another environment is replaced by one started under this
one. The old one keeps serving the launches that joined it (a shared run
may still be going) and ends with the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from hetjax import forkserver
from hetjax.job.worker import PRELOAD

_VARIABLE = "HETJAX_FORK_SERVER"


class SessionForkServer:
    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="hetjax-fs-")
        self._servers: list[subprocess.Popen] = []
        self._env: dict[str, str] | None = None

    def current(self) -> None:
        """Points HETJAX_FORK_SERVER at a server started under this
        process's environment, starting one where it has changed."""
        env = {k: v for k, v in os.environ.items() if k != _VARIABLE}
        if self._env is not None and not forkserver.differs_before_run(env, self._env):
            return
        path = os.path.join(self._folder, str(len(self._servers)))
        self._servers.append(forkserver.start_shared(path, PRELOAD, env))
        self._env = env
        os.environ[_VARIABLE] = path

    def close(self) -> None:
        os.environ.pop(_VARIABLE, None)
        for server in self._servers:
            server.kill()
            server.wait()
        shutil.rmtree(self._folder, ignore_errors=True)
