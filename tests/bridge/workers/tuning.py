"""Starts the bridge with the HETJAX_* knobs of its environment and prints
what the native module took, or the one line start-up failed with."""

import common
from common import bridge

from hetjax import _native
from hetjax.errors import ConfigError


def main():
    try:
        info = bridge.init()
    except ConfigError as e:
        print(f"start-up failed: {e}")
        return
    knobs = _native.tuning()
    print(f"rank {info.rank} native tuning: " + " ".join(f"{name}={knobs[name]}" for name in sorted(knobs)))
    common.shutdown_and_check_clean(info)


if __name__ == "__main__":
    main()
