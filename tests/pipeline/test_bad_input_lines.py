"""Bad input a new user tried, each one line on stderr and exit status 2:
an empty --islands, a command `hetjax launch` cannot start. (Malformed
configuration and cluster files: test_run_config.py.)"""

import subprocess
import sys

from hetjax import cli


def test_empty_islands_is_refused_not_taken_for_the_default(capsys):
    code = cli.main(["train", "--islands", "", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--islands: expected islands" in err and "got ''" in err


def test_launch_of_a_command_that_does_not_exist(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--", "/nonexistent/cmd"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (
        "python -m hetjax.launch: /nonexistent/cmd: no such command (not a file that can be run, nor on PATH)\n"
    )
