"""Every flag of `hetjax train`, `hetjax plan` and `hetjax prepare` with a bad
value, and other bad input a new user tried (an empty --islands, a command
`hetjax launch` cannot start): one line on stderr, exit status 2, and no
process started. (Malformed configuration and cluster files:
test_run_config.py.)"""

import subprocess
import sys

import pytest

import hetjax.launch
import hetjax.local_gpus
from hetjax import cli

# (argv, what the one line must say). GPU rows run with a faked machine of
# two NVIDIA GPUs unless they say otherwise (see `machine`).
TRAIN = [
    (["--steps", "-3"], "argument --steps: expected an integer >= 1, got -3"),
    (["--steps", "0"], "argument --steps: expected an integer >= 1, got 0"),
    (["--steps", "many"], "argument --steps: expected an integer >= 1, got 'many'"),
    (["--lr", "0"], "argument --lr: expected a number > 0, got 0"),
    (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
    (["--warmup", "-1"], "argument --warmup: expected an integer >= 0, got -1"),
    (["--warmup", "31"], "--warmup 31 is longer than the run (--steps 30)"),
    (["--max-grad-norm", "-1"], "argument --max-grad-norm: expected a number > 0, got -1"),
    (["--seed", "-5"], "argument --seed: expected an integer >= 0, got -5"),
    (["--checkpoint-every", "-2"], "argument --checkpoint-every: expected an integer >= 0, got -2"),
    (["--timeout", "0"], "argument --timeout: expected a number > 0, got 0"),
    (["--timeout", "inf"], "argument --timeout: expected a finite number, got 'inf'"),
    (["--profile-step", "-1"], "argument --profile-step: expected an integer >= 0, got -1"),
    (["--profile-step", "30"], "--profile-step 30 is never reached: the steps are 0 to 29"),
    (["--microbatches", "0"], "argument --microbatches: expected an integer >= 1, got 0"),
    (["--batch", "0"], "argument --batch: expected an integer >= 1, got 0"),
    (["--batch", "6", "--microbatches", "4"], "--batch 6 must be a multiple of --microbatches 4"),
    (["--seq-len", "0"], "argument --seq-len: expected an integer >= 1, got 0"),
    (["--seq-len", "3"], "--seq-len: expected an integer >= 8, got 3"),
    (["--stages", "0"], "argument --stages: expected an integer >= 1, got 0"),
    (["--islands", "cpu*5", "--stages", "5"], "5 stages but the model has only 4 layers"),
    (["--tflops", "400,-1"], "argument --tflops: expected a number > 0, got -1"),
    (["--tflops", "400"], "tflops: expected one value per island (2), got 1"),
    (["--memory-gb", "0,16"], "argument --memory-gb: expected a number > 0, got 0"),
    (["--islands", "cuda:0,cuda:1", "--memory-gb", "0.0001,0.0001"], "does not fit in device memory"),
    (["--schedule", "zigzag"], "argument --schedule: invalid choice: 'zigzag'"),
    (["--schedule", "interleaved"], None),  # 2 stages per island on the two CPU islands: no error
    (["--schedule", "interleaved", "--virtual-stages", "1"], None),  # one per island: plain 1F1B
    (["--schedule", "interleaved", "--islands", "cpu*2/2,cpu"], None),
    (["--schedule", "interleaved", "--replicas", "2", "--islands", "cpu,cpu,cpu,cpu"], None),
    (["--virtual-stages", "0"], "argument --virtual-stages: expected an integer >= 1, got 0"),
    (["--virtual-stages", "2"], "--virtual-stages 2 places stages for --schedule interleaved; give --schedule"),
    (["--virtual-stages", "2", "--schedule", "gpipe"], "--virtual-stages 2 places stages for --schedule interleaved"),
    (
        ["--schedule", "interleaved", "--microbatches", "3", "--batch", "6"],
        "--schedule interleaved: --microbatches 3 must be a multiple of the 2 islands",
    ),
    (
        ["--schedule", "interleaved", "--virtual-stages", "3"],
        "--schedule interleaved --virtual-stages 3 in 2 lanes on 2 islands: 6 stages but the model has only 4 layers",
    ),
    (["--schedule", "interleaved", "--stages", "4"], None),  # 2 lanes, one per island: as without --stages
    (["--schedule", "interleaved", "--stages", "6"], "give a multiple of 4 stages (--stages, --plan)"),
    (["--schedule", "interleaved", "--plan", "3,1"], "2 stage sizes given for 4 stages (2 per lane in 2 lanes"),
    (["--stages", "3"], "3 stages on 2 islands: give one stage per island, or the same number on every island"),
    (["--stages", "2", "--lanes", "2"], "--stages 2 and --lanes 2: give one (--lanes K makes K stages per island)"),
    (["--lanes", "0"], "argument --lanes: expected an integer >= 1, got 0"),
    (
        ["--schedule", "interleaved", "--parallel", "data"],
        "--parallel data: --schedule interleaved applies to pipeline",
    ),
    (
        ["--islands", "cpu*4", "--tp", "2", "--plan", "1,1,1,1", "--schedule", "1f1b"],
        "stage 0 on island0: 4 stages split the island's 4 devices, 1 per stage, but tp 2 cuts each stage over 2; "
        "give --tp 1 or at most 2 stages on island0",
    ),
    # Interleaved, the four stages run as two lanes of two devices, one tensor-parallel group each.
    (["--islands", "cpu*4", "--tp", "2", "--plan", "1,1,1,1", "--schedule", "interleaved"], None),
    (
        ["--islands", "cpu*3", "--stages", "4", "--schedule", "interleaved"],
        "--schedule interleaved on island0: 4 stages, 2 per lane (--virtual-stages), make 2 lanes, which do not "
        "split the island's 3 devices evenly; give --stages 2 or 6",
    ),
    (
        ["--islands", "cpu*4", "--stages", "4", "--schedule", "interleaved", "--microbatches", "3", "--batch", "6"],
        "--schedule interleaved: --microbatches 3 must be a multiple of the 2 lanes",
    ),
    (["--time-step", "30"], "--time-step 30 is never reached: the steps are 0 to 29"),
    (["--time-step", "-1"], "argument --time-step: expected an integer >= 0, got -1"),
    (["--time-step", "3", "--parallel", "data"], "--parallel data: --time-step applies to pipeline runs only"),
    (["--drift-every", "0"], "argument --drift-every: expected an integer >= 1, got 0"),
    (["--drift-every", "31"], "--drift-every 31 checks no step: the run has 30 (--steps)"),
    (["--drift-every", "3", "--parallel", "data"], "--parallel data: --drift-every applies to pipeline runs only"),
    (["--drift-every", "3", "--drift-factor", "0"], "argument --drift-factor: expected a number > 0, got 0"),
    (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["--remat", "some"], "argument --remat: invalid choice: 'some'"),
    (["--remat", "auto"], None),  # no memory limit on CPU islands: every stage without remat
    (
        ["--remat", "auto", "--islands", "cuda:0,cuda:1", "--memory-gb", "0.0001,0.0001"],
        "does not fit in device memory",
    ),
    (["--remat", "auto", "--parallel", "data"], "--parallel data: --remat auto applies to pipeline runs only"),
    (["--microbatches", "auto"], None),
    (["--microbatches", "many"], "argument --microbatches: expected an integer >= 1 or 'auto', got 'many'"),
    (
        ["--microbatches", "auto", "--islands", "cuda:0,cuda:1", "--memory-gb", "0.0001,0.0001"],
        "--microbatches auto: no microbatch count fits (tried 1, 2, 4, 8); 8: no split",
    ),
    (["--microbatches", "auto", "--parallel", "data"], "--parallel data: --microbatches auto applies to pipeline"),
    (["--microbatches", "auto", "--replicas", "2", "--islands", "cpu,cpu,cpu,cpu"], None),
    (["--layer-loop", "loop"], "argument --layer-loop: invalid choice: 'loop'"),
    (["--layer-loop", "unrolled", "--fsdp"], "--layer-loop unrolled runs with replicated"),
    (["--parallel", "tensor"], "argument --parallel: invalid choice: 'tensor'"),
    (["--plan", "3,3"], "must be >= 1 each and sum to the model's 4 layers"),
    (["--plan", "three"], "--plan: expected 'auto', a .json file or layers per stage"),
    (["--data", "/no/such/tokens.bin"], "--data: /no/such/tokens.bin is not 'builtin', 'synthetic' or a token file"),
    (["--shares", "1,1"], "--shares splits the batch of --parallel data"),
    (["--parallel", "data", "--shares", "3,3"], "--shares [3, 3] sum to 6, expected --microbatches 4"),
    (["--parallel", "data", "--shares", "4"], "--shares 4: 1 values for 2 islands"),
    (["--parallel", "data", "--stages", "2"], "--parallel data: --stages apply to pipeline runs only"),
    (["--zero", "2"], "argument --zero: invalid choice: 2 (choose from 0, 1)"),
    (["--zero", "1"], "--zero 1 shards the optimizer state of --parallel data; a pipeline run has none to shard"),
    (["--zero", "1", "--parallel", "pipeline"], "--zero 1 shards the optimizer state of --parallel data"),
    (["--parallel", "data", "--zero", "1", "--islands", "cpu*2"], "--zero 1 shards the optimizer state across islands"),
    (["--parallel", "data", "--zero", "1"], None),  # two CPU islands by default: no error
    (["--replicas", "0"], "argument --replicas: expected an integer >= 1, got 0"),
    (["--replicas", "2", "--islands", "cpu,cpu,cpu"], "--replicas 2: 3 islands do not split into 2 equal groups"),
    (["--replicas", "2", "--microbatches", "1"], "--replicas 2: --microbatches 1 do not split evenly"),
    (["--replicas", "2", "--islands", "cpu*2,cpu"], "replica 1's island island1 has 1 devices where replica 0's"),
    (["--replicas", "2", "--fsdp"], "--replicas with --fsdp"),
    (["--replicas", "2", "--parallel", "data"], "--parallel data: --replicas apply to pipeline runs only"),
    (["--replicas", "2", "--islands", "cpu,cpu,cpu,cpu"], None),  # two replicas of two stages: no error
    (["--grad-wire", "float16"], "argument --grad-wire: invalid choice: 'float16'"),
    (["--grad-wire", "bfloat16"], "--grad-wire bfloat16 sets how gradients cross between replicas"),
    (["--grad-wire", "bfloat16", "--parallel", "data"], None),
    (["--grad-buckets", "4"], "--grad-buckets 4 sets how gradients are reduced across replicas"),
    (["--grad-buckets", "4", "--parallel", "data"], None),
    (["--grad-buckets", "4", "--replicas", "2", "--islands", "cpu,cpu,cpu,cpu"], None),
    (["--islands", "cpu*2/2,cpu", "--fsdp"], "--fsdp with multi-process islands"),
    (
        ["--islands", "cpu*4/2", "--plan", "1,1,1,1", "--schedule", "interleaved"],
        "stage 0 on island0: expected all of the island's 4 devices, which 2 processes hold, got 2 of them",
    ),
    (["--islands", "cpu*3/2,cpu"], "3 devices do not split over 2 processes"),
    (["--islands", "cpu*2/2,cpu", "--parallel", "data"], None),
    (["--islands", "cpu*2/2,cpu"], None),
    (["--max-restarts", "-1"], "argument --max-restarts: expected an integer >= 0, got -1"),
    (["--max-restarts", "2"], "--max-restarts resumes from the newest checkpoint: give --checkpoint-every K"),
    (["--elastic"], "--elastic re-plans a restart onto the surviving islands: give --max-restarts K too"),
    (["--max-restarts", "1", "--elastic", "--parallel", "data"], "a --parallel data run restarts on its own islands"),
    (["--max-restarts", "1", "--checkpoint-every", "2", "--elastic", "--replicas", "2"], "--elastic with --replicas"),
    (["--max-restarts", "1", "--checkpoint-every", "2", "--elastic"], None),
    (["--islands", "cuda:9"], "island island0 asks for cuda:9, but this machine has 2 NVIDIA GPUs: cuda:0-1"),
    (["--islands", "cuda:0,cuda:1-2"], "island island1 asks for cuda:1-2, but this machine has 2 NVIDIA GPUs"),
    (["--islands", "cuda:0,cuda:0"], "cuda:0 is in two islands (island0 and island1)"),
    (["--islands", "rocm:0,cuda:0"], "island island0 asks for rocm:0, but this machine has no AMD GPU"),
    (["--islands", "cuda:0,cuda:1", "--parallel", "data"], None),  # the faked machine has both: no error
    (["--islands", "cpu,gpu*2"], "cannot parse 'gpu*2'"),
    (["--islands", "cpu,cuda:3-1"], "device range 3-1 is empty"),
    (["--resume", "/no/such/run"], "/no/such/run"),
]

PLAN = [
    (["--microbatches", "-1"], "argument --microbatches: expected an integer >= 1, got -1"),
    (["--tflops", "fast,1"], "argument --tflops: expected a number, got 'fast'"),
    (["--islands", "cpu*0"], "devices and processes must be >= 1"),
    (["--plan", "5"], "sum to the model's 4 layers"),
    (["--replicas", "3"], "--replicas 3: 2 islands do not split into 3 equal groups"),
    (["--schedule", "interleaved", "--microbatches", "5"], "--microbatches 5 must be a multiple of the 2 islands"),
    (["--virtual-stages", "2", "--schedule", "1f1b"], "--virtual-stages 2 places stages for --schedule interleaved"),
    (["--remat", "never"], "argument --remat: invalid choice: 'never'"),
    (["--microbatches", "some"], "argument --microbatches: expected an integer >= 1 or 'auto', got 'some'"),
    (
        ["--remat", "auto", "--schedule", "1f1b", "--islands", "cuda:0,cuda:1", "--memory-gb", "0.0001,0.0001"],
        "does not fit in device memory",
    ),
    (
        ["--microbatches", "auto", "--schedule", "1f1b", "--islands", "cuda:0,cuda:1", "--memory-gb", "1e-4,1e-4"],
        "no microbatch count fits (tried 1, 2, 4, 8); 8: no split of 4 layers",
    ),
    # Untuned, the plan tries the planner's remat and microbatches as `hetjax train` does: what is left is memory.
    (["--islands", "cuda:0,cuda:1", "--memory-gb", "1e-4,1e-4"], "(more islands, or devices with more memory"),
    (["--islands", "cuda:0,cuda:1", "--memory-gb", "1e-4,1e-4", "--microbatches", "8"], "(--remat auto recomputes"),
]


@pytest.fixture(autouse=True)
def no_workers_start(launches):
    """No test here starts a worker process (tests/pipeline/conftest.py)."""
    return launches


@pytest.fixture
def machine(monkeypatch):
    """This machine as the GPU check sees it: two NVIDIA GPUs with jax's CUDA plugin, no AMD GPU."""
    monkeypatch.setattr(hetjax.local_gpus, "gpu_count", lambda platform: 2 if platform == "cuda" else 0)
    monkeypatch.setattr(hetjax.local_gpus, "has_jax_plugin", lambda platform: True)


def exit_status(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse's errors leave this way
        return e.code


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    return lines[0]


@pytest.mark.parametrize("flags, message", TRAIN, ids=[" ".join(f) for f, _ in TRAIN])
def test_train_refuses_bad_flags(flags, message, tmp_path, capsys, machine, launches):
    status = exit_status(["train", "tiny", *flags, "--out", str(tmp_path / "run"), "--no-progress"])
    if message is None:  # a good line: it gets as far as starting the workers
        assert status == 1 and len(launches) == 1
        return
    assert status == 2 and not launches
    line = one_line(capsys.readouterr().err)
    assert line.startswith("hetjax train: ") and message in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, message", PLAN, ids=[" ".join(f) for f, _ in PLAN])
def test_plan_refuses_bad_flags(flags, message, capsys):
    assert exit_status(["plan", "tiny", *flags]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("hetjax plan: ") and message in line, line


def test_plan_does_not_need_the_gpus_it_plans_for(capsys):
    """A plan is a what-if: planning eight GPUs per vendor works on a laptop."""
    assert exit_status(["plan", "llama3.2-1b", "--islands", "cuda:0-7,rocm:0-7"]) == 0
    assert "rocm" in capsys.readouterr().out


def test_prepare_refuses_bad_input(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("hello")
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    cases = [
        ([str(tmp_path / "missing.txt"), "--tokenizer", str(tokenizer)], "text file"),
        ([str(text), "--tokenizer", str(tmp_path / "nope")], "expected a local folder of a Hugging Face tokenizer"),
        ([str(text), "--tokenizer", str(tokenizer)], "none of tokenizer.json"),
    ]
    for argv, message in cases:
        assert exit_status(["prepare", *argv, "--out", str(tmp_path / "out" / "t")]) == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith("hetjax prepare: ") and message in line, line
    assert not (tmp_path / "out").exists()


def test_missing_jax_plugin_is_named(tmp_path, capsys, monkeypatch, launches):
    monkeypatch.setattr(hetjax.local_gpus, "gpu_count", lambda platform: 2)
    monkeypatch.setattr(hetjax.local_gpus, "has_jax_plugin", lambda platform: False)
    assert exit_status(["train", "tiny", "--islands", "cuda:0,cuda:1", "--out", str(tmp_path / "r")]) == 2
    assert not launches
    line = one_line(capsys.readouterr().err)
    assert "jax has no CUDA plugin: pip install 'jax[cuda13]'" in line, line


def test_the_real_probe_on_this_machine(tmp_path, capsys):
    """Unfaked: asking for a GPU this machine lacks names what it has."""
    have = hetjax.local_gpus.gpu_count("cuda")
    assert exit_status(["train", "tiny", "--islands", f"cuda:{have}", "--out", str(tmp_path / "r")]) == 2
    line = one_line(capsys.readouterr().err)
    if have and not hetjax.local_gpus.has_jax_plugin("cuda"):
        assert "jax has no CUDA plugin" in line, line
    else:
        assert f"asks for cuda:{have}, but this machine has" in line, line


def test_empty_islands_is_refused_not_taken_for_the_default(capsys):
    code = cli.main(["train", "--islands", "", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--islands: expected islands" in err and "got ''" in err


def test_launch_of_a_command_that_does_not_exist(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--", "/nonexistent/cmd"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr == (
        "python -m hetjax.launch: /nonexistent/cmd: no such command (not a file that can be run, nor on PATH)\n"
    )
