"""The local launcher: env, prefixes, stopping everyone on failure/timeout."""

import io
import signal
import sys
import time

from hetjax.launch import ProcessSpec, run_local

PRINT_ENV = (
    "import os; print(os.environ['HETJAX_RANK'], "
    "os.environ['HETJAX_WORLD_SIZE'], len(os.environ['HETJAX_SECRET']),"
    " os.environ['HETJAX_COORDINATOR'].startswith('127.0.0.1:'),"
    " os.environ.get('EXTRA'))"
)


def _py(code):
    return [sys.executable, "-c", code]


def test_ranks_env_and_prefixed_output():
    out = io.StringIO()
    codes = run_local(
        [ProcessSpec("a", _py(PRINT_ENV)), ProcessSpec("b", _py(PRINT_ENV), {"EXTRA": "x"})], timeout_s=30, output=out
    )
    assert codes == [0, 0]
    lines = set(out.getvalue().splitlines())
    assert "[a] 0 2 64 True None" in lines
    assert "[b] 1 2 64 True x" in lines


def test_first_failure_stops_the_others():
    out = io.StringIO()
    start = time.monotonic()
    codes = run_local(
        [ProcessSpec("ok", _py("import time; time.sleep(60)")), ProcessSpec("bad", _py("raise SystemExit(3)"))],
        timeout_s=30,
        output=out,
    )
    assert codes == [-signal.SIGTERM, 3]
    assert time.monotonic() - start < 15
    assert "bad failed" in out.getvalue()


def test_timeout_stops_everyone():
    out = io.StringIO()
    codes = run_local([ProcessSpec("slow", _py("import time; time.sleep(60)"))], timeout_s=0.5, output=out)
    assert codes == [-signal.SIGTERM]
    assert "timeout" in out.getvalue()
