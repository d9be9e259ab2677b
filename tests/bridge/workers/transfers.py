"""roundtrip.py's exchange, then recv_into.py's, in one pair of CPU islands:
test_islands.py launches one pair per link kind for the tests of both. Their
tags are disjoint and roundtrip.py's ends before recv_into.py's starts (rank
0 waits for rank 1's reply). The bridge then shuts down, and must leave
nothing behind, before either OK line is printed."""

import sys

import common
import recv_into
import roundtrip
from common import bridge


def main():
    info = bridge.init()
    ok_lines = [roundtrip.exchange(info), recv_into.exchange(info)]
    common.shutdown_and_check_clean(info)
    print("\n".join(ok_lines))


if __name__ == "__main__":
    sys.exit(main())
