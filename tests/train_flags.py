"""Jobs from `hetjax train` flags, resolved in-process (nothing starts)."""

import argparse


def spec_from_flags(*flags: str):
    """The JobSpec `hetjax train <flags>` describes."""
    from hetjax.job_flags import add_train_arguments, spec_of

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return spec_of(parser.parse_args(list(flags)))


def job_from_flags(*flags: str):
    """(job, islands, plan) as `hetjax train <flags>` would run them."""
    from hetjax.job import resolve

    return resolve(spec_from_flags(*flags))
