"""Imported by the fork server of tests/bridge/test_forkserver.py: a worker
that finds it in sys.modules was forked from that server."""
