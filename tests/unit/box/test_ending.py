"""How a box ended, as one value: each cause and exit → returncode and termination; the first cause wins."""

import threading

import pytest

from quinebox.box.run.ending import Ending, Ends, Exit, How, decide

SANDBOX = "gVisor's sandbox died: out of memory; the box was killed (`quinebox doctor` checks runsc)"
LOST = "the Docker engine stopped answering while the box ran"
FULL = "the box's world grew past its world:1m grant"


@pytest.mark.parametrize(
    "cause, reason, exit, how, code, termination",
    [
        # the box's own end, no cause of the host's
        (None, None, Exit(0), How.EXITED, 0, "exit"),
        (None, None, Exit(3), How.EXITED, 3, "exit"),
        (None, None, Exit(126), How.EXITED, 126, "exit"),
        (None, None, Exit(143), How.SIGNALLED, 143, "exit"),
        (None, None, Exit(137), How.SIGNALLED, 137, "exit"),
        (None, None, Exit(137, oom=True), How.OOM, 137, "oom"),
        (None, None, Exit(0, oom=True), How.EXITED, 0, "oom"),  # a child OOM-killed, PID 1 survived
        (None, None, Exit(137, sandbox_died=SANDBOX), How.SANDBOX_DIED, 137, SANDBOX),
        (None, None, Exit(125, sandbox_died=SANDBOX), How.SANDBOX_DIED, 125, SANDBOX),
        (None, None, None, How.SIGNALLED, 137, "exit"),  # a status never told counts as killed
        # the host's causes
        (How.TIMED_OUT, None, Exit(137), How.TIMED_OUT, 124, "time"),
        (How.TIMED_OUT, None, Exit(0), How.TIMED_OUT, 124, "time"),
        (How.TIMED_OUT, None, Exit(137, oom=True), How.TIMED_OUT, 124, "time"),
        (How.TIMED_OUT, None, None, How.TIMED_OUT, 124, "time"),
        (How.WORLD_FULL, FULL, Exit(137), How.WORLD_FULL, 137, FULL),
        (How.READER_GONE, None, Exit(137), How.READER_GONE, 137, "exit"),
        (How.KILLED, None, Exit(137), How.KILLED, 137, "exit"),
        (How.KILLED, None, Exit(137, oom=True), How.KILLED, 137, "oom"),
        (How.ENGINE_LOST, LOST, None, How.ENGINE_LOST, 125, LOST),
        (How.ENGINE_LOST, LOST, Exit(0), How.ENGINE_LOST, 125, LOST),
        (How.INTERNAL_ERROR, "quinebox failed: a bug", None, How.INTERNAL_ERROR, 125, "quinebox failed: a bug"),
        (How.TIMED_OUT, None, Exit(137, sandbox_died=SANDBOX), How.TIMED_OUT, 124, "time"),
    ],
)
def test_each_ending_has_one_returncode_and_termination(cause, reason, exit, how, code, termination):
    ending = decide(cause, reason, exit)
    assert (ending.how, ending.code, ending.termination) == (how, code, termination)


def test_the_flags_are_read_from_the_ending():
    ending = Ending(How.WORLD_FULL, 137, oom=False, reason=FULL)
    assert ending.said(How.WORLD_FULL) == FULL
    assert ending.said(How.ENGINE_LOST) is None and ending.said(How.SANDBOX_DIED) is None


def test_the_first_cause_wins_and_the_box_status_completes_it():
    ends = Ends()
    assert ends.cause(How.TIMED_OUT) is True
    assert ends.cause(How.ENGINE_LOST, LOST) is False
    assert ends.cause(How.KILLED) is False
    ends.exit(137)
    ends.exit(0)  # only the first status told counts
    assert ends.settle() == Ending(How.TIMED_OUT, 124, False, None)


def test_an_oom_told_before_or_after_the_status_counts():
    before, after = Ends(), Ends()
    before.oom()
    before.exit(137)
    after.exit(137)
    after.oom()
    assert before.settle() == after.settle() == Ending(How.OOM, 137, True, None)


def test_an_oom_with_no_status_is_an_oom_kill():
    ends = Ends()
    ends.oom()
    assert ends.settle() == Ending(How.OOM, 137, True, None)


def test_a_settled_ending_does_not_change():
    ends = Ends()
    ends.exit(0)
    ends.end()
    settled = ends.settle()
    assert ends.cause(How.WORLD_FULL, FULL) is False
    ends.oom()  # too late: the box was waited on
    assert ends.settle() is settled and settled == Ending(How.EXITED, 0)


def test_the_ending_so_far_is_readable_before_it_is_settled():
    ends = Ends()
    assert ends.now().how is How.SIGNALLED and not ends.exited.is_set()
    ends.cause(How.WORLD_FULL, FULL)
    assert ends.now().said(How.WORLD_FULL) == FULL


def test_end_lets_the_wait_go_and_exit_only_the_status():
    ends = Ends()
    ends.exit(1)
    assert ends.exited.is_set() and not ends.gone.is_set()
    ends.end()
    assert ends.gone.is_set()


def test_racing_causes_leave_exactly_one():
    ends = Ends()
    causes = [How.TIMED_OUT, How.WORLD_FULL, How.KILLED, How.ENGINE_LOST, How.READER_GONE] * 20
    won: list[How] = []
    start = threading.Barrier(len(causes))

    def race(how: How) -> None:
        start.wait()
        if ends.cause(how, how.value):
            won.append(how)

    threads = [threading.Thread(target=race, args=(how,)) for how in causes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and ends.settle().how is won[0]
