"""The verbs transport over real soft-RoCE (rxe0, rxe1) inside the guest."""

import pytest


def _check(guest, name, ranks=(0,)):
    found = guest["pair"]["checks"].get(name)
    assert found, f"check {name} never ran; see {guest['out']}/rank*.log, exit codes {guest['pair']['codes']}"
    for entry in found:
        assert entry["ok"], f"rank {entry['rank']}: {entry['detail']}"
    assert sorted(e["rank"] for e in found) == sorted(ranks)
    return found


def test_cpp_verbs_tests_pass_in_the_guest(guest):
    cpp = guest["cpp"]
    assert cpp["rc"] == 0 and not cpp["failed"], cpp
    # Really ran on RDMA devices there (they skip without one).
    assert len(cpp["passed"]) >= 5, cpp


def _ring_reports(guest, test):
    found = [r for r in guest["cpp"]["ring_registration"] if r["test"] == test]
    assert found, f"no ring registration reported by {test}: {guest['cpp']}"
    return found


def test_inbound_ring_in_exportable_memory_carries_messages(guest):
    """dma-buf when the guest has udmabuf and the provider ibv_reg_dmabuf_mr;
    otherwise ibv_reg_mr on the same memory, with the reason on record."""
    assert "VerbsRingMemoryTest.TheInboundRingLivesInExportableMemory" in guest["cpp"]["passed"], guest["cpp"]
    for report in _ring_reports(guest, "exportable"):
        assert report["path"] in ("dmabuf", "peer_memory"), report
        if report["path"] == "peer_memory":
            why = report["rejected"]["dmabuf"]
            assert "/dev/udmabuf" in why if not guest["udmabuf"] else "ibv_reg_dmabuf_mr" in why, report


def test_unregistrable_ring_memory_falls_back_to_host_staging(guest):
    assert "VerbsRingMemoryTest.UnregistrableMemoryFallsBackToAHostRing" in guest["cpp"]["passed"], guest["cpp"]
    for report in _ring_reports(guest, "unregistrable"):
        assert report["path"] == "host_staging", report


def test_the_provider_answer_to_ibv_reg_dmabuf_mr_is_recorded(guest):
    for report in _ring_reports(guest, "memfd_as_dmabuf"):
        assert report["path"] != "dmabuf"
        assert "ibv_reg_dmabuf_mr failed" in report["rejected"]["dmabuf"]


def test_pyverbs_sees_the_guest_devices(guest):
    _check(guest, "env", ranks=(0,))


def test_collectives_ride_the_verbs_transport(guest):
    _check(guest, "collectives", ranks=(0, 1))


def test_both_ranks_use_verbs_on_every_device(guest):
    for entry in _check(guest, "link", ranks=(0, 1)):
        assert "rxe0" in entry["detail"] and "rxe1" in entry["detail"]


def test_the_start_up_log_names_the_devices_and_why(guest):
    for entry in _check(guest, "topology", ranks=(0, 1)):
        # No PCI parent for rxe on dummy netdevs: both kept, reason given.
        assert "equally near" in entry["detail"] or "cannot place" in entry["detail"], entry


def test_gpu_rings_without_a_gpu_fall_back_to_host_memory(guest):
    lines = guest["pair"]["gpu_ring_lines"]
    assert lines["0"] == [], lines  # rank 0 did not ask
    assert len(lines["1"]) == 2, lines  # one queue pair per rxe device
    for line in lines["1"]:
        assert "registered by host_staging" in line, line


def test_jit_send_recv_every_dtype(guest):
    _check(guest, "dtypes", ranks=(1,))


def test_large_message_inside_jit(guest):
    _check(guest, "large", ranks=(1,))


def test_out_of_order_tags(guest):
    _check(guest, "out_of_order", ranks=(1,))


def test_wrong_secret_is_refused(guest):
    _check(guest, "wrong_secret", ranks=(1,))


def test_peer_killed_mid_message_fails_the_survivor_clearly(guest):
    (entry,) = _check(guest, "killed", ranks=(0,))
    assert "PeerLostError" in entry["detail"] and "rank 1" in entry["detail"]
    _check(guest, "survivor_shutdown", ranks=(0,))
    # Rank 1 was SIGKILLed (-9), rank 0 left cleanly.
    assert guest["pair"]["codes"] == [0, -9]


@pytest.mark.parametrize("limit_s", [180])
def test_guest_checks_stay_within_budget(guest, limit_s):
    assert guest["seconds"] < limit_s, guest["seconds"]
