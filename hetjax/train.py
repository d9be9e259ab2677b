"""`hetjax train`: plan a model over islands, launch one process per island,
train, and record metrics.

The flags fill a JobSpec (hetjax/job_flags.py); the library prepares it
(plan, checks) and runs it (hetjax/job/runner.py): it writes job.json into
the run folder and starts one worker per island process
(`python -m hetjax.job.worker job.json`). The last stage's process writes
metrics.jsonl (one line per step) and summary.json.
"""

from __future__ import annotations

import sys

from hetjax.config_flags import add_config_arguments, mark_defaults, spec_of_command_line, unmarked
from hetjax.flags import DefaultsHelpFormatter, OneLineParser
from hetjax.job_flags import add_train_arguments


def add_arguments(p) -> None:
    p.formatter_class = DefaultsHelpFormatter
    add_train_arguments(p)
    add_config_arguments(p)
    mark_defaults(p)  # last: a flag given overrides --config, one left out does not


def run(args) -> int:
    from hetjax.job import PREPARE_ERRORS, prepare
    from hetjax.job import run as run_job
    from hetjax.job.config_file import dump_config

    try:
        spec = spec_of_command_line(args)
        if unmarked(args).print_config:
            print(dump_config(spec), end="")
            return 0
        job, islands, plan = prepare(spec)
    except PREPARE_ERRORS as e:
        print(f"hetjax train: {e}", file=sys.stderr)
        return 2
    return run_job(spec, job, islands, plan)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="hetjax train", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
