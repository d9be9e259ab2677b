"""`hetjax train --config FILE`: the JobSpec from YAML or TOML, every flag
given overriding the field it sets, --print-config writing what --config
reads back, and a file that does not parse as one line with file, line and
column (configuration and cluster files alike), exit status 2."""

import argparse

import pytest

from hetjax import cli
from hetjax.config_flags import Unset, _fields_set_by, spec_of_command_line
from hetjax.job.config_file import load_config
from hetjax.train import add_arguments

EXAMPLE = "examples/llama3_8b_two_islands.yaml"


def train(capsys, *argv):
    """(exit code, stdout, stderr) of `hetjax train ARGV`, in this process."""
    try:
        code = cli.main(["train", *argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def parsed(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_example_runs_its_fields_and_the_flags_given_override_them(repo_root):
    spec = spec_of_command_line(parsed("--config", str(repo_root / EXAMPLE), "--steps", "3"))
    assert (spec.model, spec.dtype, spec.layout.islands) == ("llama3-8b", "bfloat16", "cuda:0,cuda:1")
    assert (spec.schedule.microbatches, spec.data.seq_len, spec.checkpoint.keep) == (32, 4096, 3)
    assert spec.steps == 3  # the flag, over the file's 1000
    tiny = spec_of_command_line(
        parsed("--config", str(repo_root / EXAMPLE), "tiny", "--islands", "cpu,cpu", "--no-plot", "--batch", "32")
    )
    assert (tiny.model, tiny.layout.islands, tiny.run.plot, tiny.data.batch) == ("tiny", "cpu,cpu", False, 32)
    assert tiny.data.seq_len == 4096  # not given: the file's


def test_every_flag_overrides_the_field_it_sets(repo_root):
    """Each flag, given with its default value, puts that value over the
    example's: found for every flag of the parser, those to come included."""
    config = str(repo_root / EXAMPLE)
    left_out = parsed("--config", config)
    plain = argparse.Namespace(**{d: v.value if isinstance(v, Unset) else v for d, v in vars(left_out).items()})
    from_file = spec_of_command_line(left_out)
    for dest, value in vars(left_out).items():
        if dest in ("config", "print_config"):
            continue
        fields = _fields_set_by(dest, plain)
        assert fields, f"--{dest.replace('_', '-')} sets no JobSpec field"
        given = argparse.Namespace(**{**vars(left_out), dest: value.value})
        spec = spec_of_command_line(given)
        flags_only = spec_of_command_line(argparse.Namespace(**{**vars(plain), "config": None}))
        for section, field in fields:
            got = getattr(spec, section) if field is None else getattr(getattr(spec, section), field)
            want = getattr(flags_only, section) if field is None else getattr(getattr(flags_only, section), field)
            assert got == want, (dest, section, field)
        unrelated = [(s, f) for s, f in [("data", "seq_len"), ("layout", "islands")] if (s, f) not in fields]
        for section, field in unrelated:
            assert getattr(getattr(spec, section), field) == getattr(getattr(from_file, section), field), dest


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_print_config_round_trips(capsys, tmp_path, repo_root, suffix):
    code, first, _ = train(capsys, "--config", str(repo_root / EXAMPLE), "--steps", "3", "--print-config")
    assert code == 0
    written = tmp_path / f"run{suffix}"
    if suffix == ".toml":  # the same spec in TOML: what --config also reads
        import toml  # draccus's own dependency
        import yaml

        written.write_text(toml.dumps(_without_nulls(yaml.safe_load(first))))
    else:
        written.write_text(first)
    code, again, _ = train(capsys, "--config", str(written), "--print-config")
    assert code == 0 and again == first
    assert load_config(written).steps == 3


def _without_nulls(tree):
    if isinstance(tree, dict):
        return {k: _without_nulls(v) for k, v in tree.items() if v is not None}
    return tree


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("run.yaml", "steps: 3\nlayout:\n  islands: cpu\n   stages: 2\n", ":4:10: YAML syntax error: "),
        ("run.toml", "steps = 3\n[layout]\nislands = cpu\n", ":3:11: TOML syntax error: "),
    ],
)
def test_a_config_that_does_not_parse_is_one_line(capsys, tmp_path, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = train(capsys, "--config", str(path))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"hetjax train: --config {path}{where}"), err


def test_a_config_field_of_the_wrong_type_or_name_is_one_line(capsys, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: many\n")
    code, _, err = train(capsys, "--config", str(path))
    assert code == 2 and err.count("\n") == 1 and "`steps`: Couldn't parse 'many' into an int" in err, err
    path.write_text("layout: {islandz: cpu}\n")
    code, _, err = train(capsys, "--config", str(path))
    assert code == 2 and "The fields `islandz` are not valid for LayoutSpec" in err, err


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("cluster.yaml", "islands:\n  - platform: cpu\n   devices: [1\n", ":3:4: YAML syntax error: "),
        ("cluster.toml", 'islands = [\n  { platform = "cpu" devices = 1 },\n]\n', ":2:22: TOML syntax error: "),
    ],
)
def test_a_cluster_file_that_does_not_parse_is_one_line(capsys, tmp_path, name, text, where):
    path = tmp_path / name
    path.write_text(text)
    code, _, err = train(capsys, "--islands", str(path), "--no-progress")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"hetjax train: cluster file {path}{where}"), err
