"""The bridge's tuning knobs (hetjax/bridge/tuning.py): read from HETJAX_*
variables, validated with one-line errors, handed to the native module, and
the must-agree ones compared at start-up."""

import dataclasses
import re

import pytest

from hetjax.bridge import tuning
from hetjax.bridge.tuning import BridgeTuning
from hetjax.errors import ConfigError


def test_unset_or_blank_variables_leave_the_defaults():
    assert BridgeTuning.from_environ({}) == BridgeTuning()
    assert BridgeTuning.from_environ({"HETJAX_GPU_PIECE_BYTES": "  "}) == BridgeTuning()


def test_variables_are_read_into_typed_fields():
    knobs = BridgeTuning.from_environ(
        {
            "HETJAX_GPU_PIECE_BYTES": "4194304",
            "HETJAX_GPU_PAIR": "0",
            "HETJAX_TIMEOUT": "2.5",
            "HETJAX_TRANSPORT": "TCP",
            "HETJAX_RDMA_DEVICES": "mlx5_0, mlx5_1:1,",
            "HETJAX_GPU_ROUND_LANES": "2",
        }
    )
    assert knobs.gpu_piece_bytes == 4194304
    assert knobs.gpu_pair is False
    assert knobs.timeout_s == 2.5
    assert knobs.transport == "tcp"
    assert knobs.rdma_devices == ("mlx5_0", "mlx5_1:1")
    assert knobs.gpu_round_lanes == 2


@pytest.mark.parametrize(
    "env,text,error",
    [
        ("HETJAX_GPU_PIECE_BYTES", "16M", "expected an integer from 4096 to 67108864, got '16M'"),
        ("HETJAX_GPU_PIECE_BYTES", "1024", "expected an integer from 4096 to 67108864, got '1024'"),
        ("HETJAX_GPU_PAIR_CHUNK_BYTES", "100", "expected an integer from 16 to 4294967296, a multiple of 16"),
        ("HETJAX_GPU_PAIR", "yes", "expected 0 or 1, got 'yes'"),
        ("HETJAX_TCP_STREAMS", "0", "expected an integer >= 1, got '0'"),
        ("HETJAX_TIMEOUT", "0", "expected a number > 0, got '0'"),
        ("HETJAX_TIMEOUT", "inf", "expected a number > 0, got 'inf'"),
        ("HETJAX_GPU_COLLECTIVES", "fast", "expected one of channels, staged, got 'fast'"),
        ("HETJAX_GPU_ROUND_LANES", "9", "expected an integer from 1 to 8, got '9'"),
        ("HETJAX_SPIN_US", "-1", "expected an integer from 0 to 1000000, got '-1'"),
    ],
)
def test_a_bad_variable_fails_with_one_line_naming_it(env, text, error):
    with pytest.raises(ConfigError) as raised:
        BridgeTuning.from_environ({env: text})
    message = str(raised.value)
    assert message.startswith(f"{env}: {error}"), message
    assert "\n" not in message


def test_arguments_win_over_variables_and_are_checked_alike():
    knobs = BridgeTuning.from_environ({"HETJAX_TCP_STREAMS": "2"}, tcp_streams=8, transport=None)
    assert knobs.tcp_streams == 8
    with pytest.raises(ConfigError, match=r"^HETJAX_TCP_STREAMS \(tcp_streams\): expected an integer >= 1, got 0$"):
        BridgeTuning.from_environ({}, tcp_streams=0)
    with pytest.raises(ConfigError, match=r"^HETJAX_GPU_PAIR \(gpu_pair\): expected 0 or 1, got 1$"):
        BridgeTuning(gpu_pair=1)


def test_every_field_is_a_knob_with_a_variable_of_its_own():
    knobs = tuning.knobs()
    assert list(knobs) == [field.name for field in dataclasses.fields(BridgeTuning)]
    names = [knob.env for knob in knobs.values()]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"HETJAX_[A-Z0-9_]+", name) for name in names)
    # Every default is a value its own knob takes (or None: chosen where used).
    BridgeTuning()
    assert all(knob.default_text for name, knob in knobs.items() if getattr(BridgeTuning(), name) is None)


def test_the_native_share_leaves_machine_dependent_knobs_to_the_module():
    native = BridgeTuning(spin_us=0, gpu_pair_copies=True).native()
    assert native["spin_us"] == 0 and native["gpu_pair_copies"] is True
    assert "host_copy_threads" not in native and "gpu_round_lanes" not in native
    assert "timeout_s" not in native  # the start's own argument, not a native knob


def test_ranks_that_agree_pass():
    same = BridgeTuning(gpu_piece_bytes=1 << 20).same_on_every_rank()
    tuning.check_same_on_every_rank([same, dict(same), dict(same)])


def test_the_first_rank_that_differs_is_named_with_both_values():
    first = BridgeTuning(gpu_piece_bytes=1 << 20).same_on_every_rank()
    other = BridgeTuning(gpu_piece_bytes=4 << 20, gpu_pair=False).same_on_every_rank()
    with pytest.raises(ConfigError) as raised:
        tuning.check_same_on_every_rank([first, first, other])
    assert str(raised.value) == (
        "HETJAX_GPU_PIECE_BYTES: rank 2 has 4194304, rank 0 has 1048576; it must be the same on every rank"
    )
    with pytest.raises(ConfigError, match=r"^HETJAX_GPU_PAIR: rank 1 has 0, rank 0 has 1; it must be the same"):
        tuning.check_same_on_every_rank([first, {**first, "gpu_pair": False}])


def test_knobs_that_may_differ_are_not_compared():
    one = BridgeTuning(tcp_streams=1, spin_us=0, gpu_slots=4).same_on_every_rank()
    other = BridgeTuning(tcp_streams=8, gpu_round_lanes=1).same_on_every_rank()
    tuning.check_same_on_every_rank([one, other])


def test_the_native_module_knows_every_native_knob_and_shares_its_defaults():
    native = pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")
    defaults = native.default_tuning()
    ours = {name for name, knob in tuning.knobs().items() if knob.native}
    assert set(defaults) == ours
    for name in ours:
        value = getattr(BridgeTuning(), name)
        if value is not None:  # None: the module's machine-dependent default
            assert defaults[name] == value, name


def _pair(env0, env1):
    return [("island0", "tuning.py", [], env0), ("island1", "tuning.py", [], env1)]


def test_islands_hand_their_knobs_to_the_native_module(run_workers):
    pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")
    knobs = {"HETJAX_GPU_PIECE_BYTES": "4194304", "HETJAX_SPIN_US": "0"}
    codes, out = run_workers(_pair({**knobs, "HETJAX_HOST_COPY_NT": "0"}, knobs), timeout_s=90, HETJAX_TIMEOUT="30")
    assert codes == [0, 0]
    for rank in (0, 1):
        line = re.search(rf"rank {rank} native tuning: (.*)", out).group(1).split()
        assert {"gpu_piece_bytes=4194304", "spin_us=0", "gpu_pair=True"} <= set(line), line
    assert "host_copy_nt=False" in re.search(r"rank 0 native tuning: (.*)", out).group(1)


def test_a_knob_set_differently_on_one_rank_stops_start_up_with_one_line(run_workers):
    pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")
    codes, out = run_workers(_pair({}, {"HETJAX_GPU_PIECE_BYTES": "4194304"}), timeout_s=90, HETJAX_TIMEOUT="30")
    assert codes == [0, 0]
    expected = (
        "start-up failed: HETJAX_GPU_PIECE_BYTES: rank 1 has 4194304, rank 0 has 16777216; "
        "it must be the same on every rank"
    )
    assert out.count(expected) == 2, out
