"""Plot a bench_train.py result: loss per step of (a) and (b), and tokens/s per step.

python bench/plot_bench.py bench/results/train_h200x2.json bench/results/train_h200x2.png

The drawing lives in hetjax.plots (plot_bench); this is its command line.
"""

from __future__ import annotations

import json
import sys

from hetjax.plots import plot_bench as plot


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plot(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
