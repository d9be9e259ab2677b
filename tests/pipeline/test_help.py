"""`hetjax train --help` as a new user reads it: flags in groups, each with
help text and its default, the model presets listed; `hetjax --version`."""

import re

import pytest

from hetjax import cli
from hetjax.flags import OneLineParser
from hetjax.job_flags import GROUPS
from hetjax.train import add_arguments


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def entries(text: str) -> dict[str, str]:
    """{flag or positional: its help}, from the option list of a --help."""
    found = {}
    for entry in re.split(r"\n(?=  \S)", text):
        head = re.match(r"  (-{1,2}[\w-]+|\w+)", entry)
        if head:
            found.setdefault(head.group(1), entry)
    return found


def test_every_flag_has_help_and_says_its_default(capsys):
    text = help_text(capsys, "train")
    listed = entries(text)
    parser = OneLineParser(prog="hetjax train")
    add_arguments(parser)
    missing = []
    for action in parser._actions:
        name = action.option_strings[-1] if action.option_strings else action.dest
        if name in ("--help", "--print-config"):  # actions, not settings
            continue
        entry = listed.get(name, "")
        described = entry.split(None, 2)[-1] if entry else ""
        if not action.help or "default" not in described.lower():
            missing.append(name)
    assert not missing, f"flags without help or without their default in --help: {missing}"


def test_flags_come_in_groups_and_the_presets_are_listed(capsys):
    text = help_text(capsys, "train")
    titles = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ]+:", line)]
    assert titles[1 : 1 + len(GROUPS)] == list(GROUPS)
    for preset in ("tiny", "llama3-8b", "qwen2-0.5b"):
        assert preset in entries(text)["model"]


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"hetjax \S+ \(jax \S+, jaxlib \S+\)\n", capsys.readouterr().out)
