"""The `hetjax` command: a thin dispatcher, one module per subcommand.

Each subcommand module offers add_arguments(parser) and run(args) -> exit code.
"""

from __future__ import annotations

import importlib
import sys

from hetjax.flags import OneLineParser

# name -> (module, one-line help)
SUBCOMMANDS = {
    "train": ("hetjax.train", "train a model as pipeline stages over islands"),
    "plan": ("hetjax.plan_command", "split a model's layers over islands and print the plan"),
    "prepare": ("hetjax.data", "tokenize local text files into a token file"),
    "launch": ("hetjax.engines.per_host", "start the processes of one host of a cluster file (ssh, Kubernetes)"),
    "drift": ("hetjax.drift.command", "compare a model's numerics layer by layer across islands"),
    "info": ("hetjax.info", "report the native flavour, FFI handlers, transports and devices"),
}


def version() -> str:
    """hetjax's version as installed (pip's metadata), with jax's beside it."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    return f"hetjax {of('hetjax')} (jax {of('jax')}, jaxlib {of('jaxlib')})"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="hetjax")
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return importlib.import_module(args._module).run(args)


if __name__ == "__main__":
    sys.exit(main())
