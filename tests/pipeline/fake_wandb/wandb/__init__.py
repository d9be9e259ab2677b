"""A stand-in for the wandb package that records every call into the JSON
file $FAKE_WANDB_CALLS (one list of [name, args] pairs), for tests that
must not reach the real service."""

import json
import os

_calls = []


def _record(call, **args):
    _calls.append([call, args])
    with open(os.environ["FAKE_WANDB_CALLS"], "w") as f:
        json.dump(_calls, f)


class _Run:
    def define_metric(self, name, step_metric=None):
        _record("define_metric", name=name, step_metric=step_metric)

    def log(self, data):
        _record("log", data=data)

    def finish(self):
        _record("finish")


def init(**kwargs):
    _record("init", **{k: v for k, v in kwargs.items() if k != "config"}, config_keys=sorted(kwargs.get("config", {})))
    return _Run()
