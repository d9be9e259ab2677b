"""Checkpoints that never wait for the previous write: every saving process
takes a due save at the same step boundary, the first one at which every
process has finished writing the previous save; saves that fall due
meanwhile are coalesced into it, said once, and the last one is always
written. In-process: the agreement's files, no training."""

import threading

from hetjax.job.checkpoints import CheckpointSaver
from hetjax.job.save_agreement import SaveAgreement, folder_of, remove


def agreements(tmp_path, every: int, ranks=(0, 1)) -> list[SaveAgreement]:
    return [SaveAgreement(tmp_path, "launch", every, list(ranks), r) for r in ranks]


def test_due_saves_are_taken_at_their_step_while_writes_keep_up(tmp_path):
    a, b = agreements(tmp_path, every=2)
    taken = []
    for step in range(1, 9):
        both = [s.saves_at(step) for s in (a, b)]
        assert both[0] == both[1]
        if both[0]:
            taken.append(step)
            a.written(step)  # each write done before the next boundary
            b.written(step)
    assert taken == [2, 4, 6, 8] and a.deferred == b.deferred == 0


def test_a_save_due_during_a_write_waits_for_it_on_every_process(tmp_path):
    a, b = agreements(tmp_path, every=1)
    assert a.saves_at(1) and b.saves_at(1)  # the first save of a launch waits for nothing
    a.written(1)
    # Process a reaches boundaries 2 and 3 while b still writes: it decides to defer.
    assert not a.saves_at(2) and not a.saves_at(3)
    b.written(1)  # b's write ends before b reaches boundary 2: it follows a's decisions all the same
    assert not b.saves_at(2) and not b.saves_at(3)
    assert a.saves_at(4) and b.saves_at(4)  # the first boundary after both writes: saves 2-4 in one
    assert (a.last_saved, b.last_saved, a.deferred, b.deferred) == (4, 4, 2, 2)


def test_decisions_are_made_once_by_whoever_comes_first(tmp_path):
    processes = agreements(tmp_path, every=1, ranks=range(6))
    for s in processes:
        assert s.saves_at(1)
    results = {}
    start = threading.Barrier(len(processes))

    def boundary(s):
        start.wait()
        results[s.rank] = s.saves_at(2)

    threads = [threading.Thread(target=boundary, args=(s,)) for s in processes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results.values()) == {False}  # nobody had written step 1
    remove(tmp_path, "launch")
    assert not folder_of(tmp_path, "launch").exists()


class FakeCheckpointer:
    """A StageCheckpointer whose writes end when the test says."""

    def __init__(self, root, on_written):
        self.root, self.on_written, self.saved = root, on_written, []

    def save(self, step):
        self.saved.append(step)
        return self.root / f"step_{step}"

    def close(self):
        pass


def test_the_saver_says_once_that_saves_are_coalesced_and_always_writes_the_last(tmp_path, capsys):
    job = type("Job", (), {"checkpoint_dir": str(tmp_path / "ckpt"), "out": str(tmp_path)})()
    made = []
    saves = SaveAgreement(tmp_path, "launch", 1, [0], 0)
    saver = CheckpointSaver(
        job, lambda root, on_written: made.append(FakeCheckpointer(root, on_written)) or made[-1], saves
    )
    assert saver.save_if_due(1) is not None
    for step in (2, 3, 4):  # the write of step 1 has not ended
        assert saver.save_if_due(step) is None
    made[0].on_written(1)
    assert saver.save_if_due(5) is not None
    saver.save_last(5)  # the step's save was just taken: not again
    saver.save_last(6)
    assert made[0].saved == [1, 5, 6]
    lines = [line for line in capsys.readouterr().out.splitlines() if "coalesced" in line]
    assert len(lines) == 1 and "checkpoint writes outlast 1 step(s)" in lines[0]
    assert saves.last_saved == 5


def test_a_process_that_saves_nothing_learns_the_newest_save_taken(tmp_path):
    from hetjax.job.save_agreement import last_taken

    a, b = agreements(tmp_path, every=2)
    assert last_taken(tmp_path, "launch", 5) is None  # no boundary decided yet
    assert a.saves_at(2) and b.saves_at(2)
    assert not a.saves_at(4) and not b.saves_at(4)  # the write of step 2 still runs
    assert last_taken(tmp_path, "launch", 5) == 2  # the deferred save of step 4 is not taken
    a.written(2)
    b.written(2)
    assert a.saves_at(5) and b.saves_at(5)
    assert last_taken(tmp_path, "launch", 4) == 2 and last_taken(tmp_path, "launch", 5) == 5
