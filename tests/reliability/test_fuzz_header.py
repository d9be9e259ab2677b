"""Fuzzing the wire header parser under AddressSanitizer + UBSan.

A small C++ driver (fuzz/header_driver.cc) linked with the transport's own
wire.cc is built with sanitizers and fed hypothesis-made headers: mostly
valid ones with a field or two made hostile, and raw random bytes. Every
verdict is checked against a Python model of the format (wire.h): accept
exactly what it accepts, with the same fields; reject everything else; never
crash or report (the driver aborts on a sanitizer finding).
"""

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
MAGIC, VERSION, MAX_RANK = 0x42584A48, 1, 8
GOODBYE, HEARTBEAT = 1, 2  # wire.h flags
DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 2, 12: 4, 13: 8, 14: 8, 15: 16, 16: 1}
U64 = 2**64


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ to build the sanitizer driver")
    exe = tmp_path_factory.mktemp("fuzz") / "header_driver"
    subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            f"-I{REPO}",
            str(REPO / "tests/reliability/fuzz/header_driver.cc"),
            str(REPO / "cc/transport/wire.cc"),
            str(REPO / "cc/transport/tensor_spec.cc"),
            "-o",
            str(exe),
        ],
        check=True,
        timeout=180,
    )
    proc = subprocess.Popen(
        [str(exe)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1"},
    )
    yield proc
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0, proc.stderr.read().decode()[-3000:]


def parse(driver, header: bytes, max_bytes: int) -> str:
    assert len(header) == 128
    driver.stdin.write(header + struct.pack("<Q", max_bytes))
    driver.stdin.flush()
    line = driver.stdout.readline().decode()
    assert line, f"driver died: {driver.stderr.read().decode()[-3000:]}"
    return line.strip()


def encode(magic, version, dtype, rank, source, flags, tag, seq, payload, offset, length, dims, reserved):
    return (
        struct.pack("<IHBBiIQQQQQ", magic, version, dtype, rank, source, flags, tag, seq, payload, offset, length)
        + b"".join(struct.pack("<Q", d % U64) for d in dims)
        + struct.pack("<Q", reserved)
    )


def model(fields, max_bytes):
    """What wire.h promises: the accepted fields, or None for a rejection."""
    magic, version, dtype, rank, source, flags, tag, seq, payload, offset, length, dims, _ = fields
    if magic != MAGIC or version != VERSION or dtype not in DTYPE_SIZES or rank > MAX_RANK:
        return None
    shape = [d if d < 2**63 else d - U64 for d in (x % U64 for x in dims[:rank])]
    if any(d < 0 for d in shape):
        return None
    # The parser multiplies left to right with overflow checks, so a shape
    # whose running product overflows is refused even if a later axis is 0.
    elements = 1
    for d in shape:
        elements *= d
        if elements >= U64:
            return None
    count = elements * DTYPE_SIZES[dtype]
    if count >= U64 or count != payload or payload > max_bytes:
        return None
    if flags not in (0, GOODBYE, HEARTBEAT) or (flags and payload):  # control frames carry nothing
        return None
    if offset > payload or length > payload - offset:
        return None
    return " ".join(map(str, ["ok", source, flags, tag, seq, payload, offset, length, dtype, rank, *shape]))


u64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**31, 2**32, 2**40, 2**63, 2**64 - 1]))


HOSTILE = {
    "magic": st.integers(0, 2**32 - 1),
    "version": st.integers(0, 2**16 - 1),
    "dtype": st.integers(0, 255),
    "rank": st.integers(0, 255),
    "flags": st.one_of(st.sampled_from([GOODBYE, HEARTBEAT, GOODBYE | HEARTBEAT, 4]), st.integers(0, 2**32 - 1)),
    "payload": u64,
    "offset": u64,
    "length": u64,
    "dims": st.lists(u64, min_size=8, max_size=8),
}


@st.composite
def headers(draw):
    """A well-formed header (so the deep checks are reached) with up to two
    fields replaced by hostile values."""
    f = {
        "magic": MAGIC,
        "version": VERSION,
        "dtype": draw(st.sampled_from(sorted(DTYPE_SIZES))),
        "rank": draw(st.integers(0, 3)),
        "flags": 0,
        "dims": draw(st.lists(st.integers(0, 9), min_size=8, max_size=8)),
    }
    count = DTYPE_SIZES[f["dtype"]]
    for d in f["dims"][: f["rank"]]:
        count *= d
    f["payload"] = count
    f["offset"] = draw(st.integers(0, count))
    f["length"] = draw(st.integers(0, count - f["offset"]))
    for name in draw(st.sets(st.sampled_from(sorted(HOSTILE)), max_size=2)):
        f[name] = draw(HOSTILE[name])
    return (
        f["magic"],
        f["version"],
        f["dtype"],
        f["rank"],
        draw(st.integers(-(2**31), 2**31 - 1)),
        f["flags"],
        draw(u64),
        draw(u64),
        f["payload"],
        f["offset"],
        f["length"],
        f["dims"],
        draw(u64),
    )


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(fields=headers(), max_bytes=st.one_of(st.just(1 << 30), u64))
@pytest.mark.slow  # 1,500 generated headers, 13 s
def test_parser_accepts_exactly_what_the_format_allows(driver, fields, max_bytes):
    verdict = parse(driver, encode(*fields), max_bytes)
    expected = model(fields, max_bytes)
    if expected is None:
        assert verdict.startswith("err bad frame header: "), verdict
    else:
        assert verdict == expected


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(min_size=128, max_size=128), max_bytes=u64)
def test_random_bytes_are_rejected_or_self_consistent(driver, raw, max_bytes):
    verdict = parse(driver, raw, max_bytes)
    assert verdict.startswith(("ok ", "err bad frame header: ")), verdict


def test_a_terabyte_claim_is_refused_by_its_size(driver):
    tib = 1 << 40
    verdict = parse(driver, encode(MAGIC, VERSION, 6, 1, 0, 0, 7, 0, tib, 0, 1 << 20, [tib] + [0] * 7, 0), 1 << 30)
    assert verdict == (f"err bad frame header: payload of {tib} bytes exceeds max_message_bytes {1 << 30}")


def test_a_heartbeat_is_accepted_only_without_a_payload(driver):
    beat = dict(
        magic=MAGIC,
        version=VERSION,
        dtype=6,
        rank=1,
        source=2,
        flags=HEARTBEAT,
        tag=0,
        seq=0,
        offset=0,
        dims=[0] * 8,
        reserved=0,
    )
    assert parse(driver, encode(**beat, payload=0, length=0), 1 << 30) == "ok 2 2 0 0 0 0 0 6 1 0"
    with_payload = encode(**{**beat, "dims": [4] + [0] * 7}, payload=4, length=4)
    assert parse(driver, with_payload, 1 << 30) == "err bad frame header: heartbeat frame with a payload of 4 bytes"


def test_another_protocol_version_is_named(driver):
    verdict = parse(driver, encode(MAGIC, 2, 12, 0, 0, 0, 0, 0, 4, 0, 4, [0] * 8, 0), 1 << 30)
    assert verdict == "err bad frame header: protocol version 2, this build speaks 1"
