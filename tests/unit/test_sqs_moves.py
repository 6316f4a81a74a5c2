"""Message move tasks (rayq.sqs.moves): the task table, its shapes, pacing and the mover's
loop, over a memory KV and a fake clock."""

import pytest

from rayq.core.kit.clock import FakeClock
from rayq.errors import AuthError
from rayq.sqs.errors import SqsError
from rayq.sqs.moves import (BATCH, DEFAULT_RATE_PER_S, KEPT_TASKS, MoveFailed, MoveStatus,
                            MoveTask, MoveTasks, handle_source, new_handle, pause_s, run,
                            signed_anew)
from rayq.testing import MemoryKV

SOURCE = "arn:aws:sqs:eu-west-1:123456789012:dlq"
OTHER = "arn:aws:sqs:eu-west-1:123456789012:other-dlq"


def a_task(source=SOURCE, to_move=30, rate=None, started_ms=1000, **changes) -> MoveTask:
    return MoveTask(new_handle(source), "acme", "eu-west-1", source, None, rate, to_move,
                    started_ms, **changes)


@pytest.fixture
def tasks():
    return MoveTasks(MemoryKV())


class Source:
    """A source queue of ``count`` messages moved by ``batch(n)``; ``left`` of them have
    no destination; it can fail from a given batch on."""

    def __init__(self, count, left=0, fail_at=None):
        self.count, self.left, self.fail_at, self.sizes = count, left, fail_at, []

    def batch(self, n):
        if self.fail_at is not None and len(self.sizes) >= self.fail_at:
            raise MoveFailed("AWS.SimpleQueueService.NonExistentQueue")
        self.sizes.append(n)
        got = min(n, self.count)
        self.count -= got
        stay = min(got, self.left)
        self.left -= stay
        return got - stay, stay, got


def waiting(clock, stop_after=None, each=None):
    calls = []

    def wait(s):
        calls.append(s)
        clock.advance(s)
        if each is not None:
            each(len(calls))
        return stop_after is not None and len(calls) >= stop_after
    return wait, calls


# -- shapes --------------------------------------------------------------------------------
def test_a_running_task_lists_with_its_handle_and_a_finished_one_without():
    task = a_task(rate=5)
    entry = task.entry()
    assert entry == {"Status": "RUNNING", "SourceArn": SOURCE, "TaskHandle": task.handle,
                     "ApproximateNumberOfMessagesMoved": 0,
                     "ApproximateNumberOfMessagesToMove": 30, "StartedTimestamp": 1000,
                     "MaxNumberOfMessagesPerSecond": 5}
    failed = MoveTask(task.handle, "acme", "eu-west-1", SOURCE, OTHER, None, 30, 1000,
                      MoveStatus.FAILED, 3, "AWS.SimpleQueueService.NonExistentQueue")
    assert failed.entry() == {"Status": "FAILED", "SourceArn": SOURCE, "DestinationArn": OTHER,
                              "ApproximateNumberOfMessagesMoved": 3,
                              "ApproximateNumberOfMessagesToMove": 30,
                              "StartedTimestamp": 1000,
                              "FailureReason": "AWS.SimpleQueueService.NonExistentQueue"}


def test_a_task_survives_its_record():
    task = a_task(rate=7, status=MoveStatus.CANCELLING, moved=4)
    assert MoveTask.from_record(task.to_record()) == task


def test_a_handle_names_its_source_and_a_foreign_handle_is_invalid():
    assert handle_source(new_handle(SOURCE)) == SOURCE
    for bad in ("not-a-handle", "e30=", 17):
        with pytest.raises(SqsError) as info:
            handle_source(bad)
        assert info.value.code == "InvalidParameterValue"
    with pytest.raises(SqsError) as info:
        handle_source(None)
    assert info.value.code == "MissingParameter"


@pytest.mark.parametrize("done, rate, elapsed_s, expected", [
    (0, 10, 0.0, 0.0),
    (10, 10, 0.0, 1.0),      # a batch of 10 at 10/s: the next one a second later
    (10, 10, 0.4, 0.6),
    (10, 10, 2.0, 0.0),      # behind: no wait
    (3, 1, 1.0, 2.0),
    (500, 500, 0.25, 0.75),
])
def test_the_pause_keeps_the_moved_count_to_the_rate(done, rate, elapsed_s, expected):
    assert pause_s(done, rate, elapsed_s) == pytest.approx(expected)


# -- the table --------------------------------------------------------------------------
def test_one_active_task_per_source_and_others_go_on(tasks):
    first = a_task()
    assert tasks.start(first)
    assert not tasks.start(a_task())             # RUNNING
    assert tasks.start(a_task(source=OTHER))     # another source
    tasks.cancel(first.handle)
    assert not tasks.start(a_task())             # CANCELLING is still active
    tasks.finish(first.handle, MoveStatus.CANCELLED)
    assert tasks.start(a_task())


def test_tasks_list_newest_first_and_the_last_ten_are_kept(tasks):
    made = []
    for i in range(KEPT_TASKS + 2):
        task = a_task(started_ms=i)
        assert tasks.start(task)
        tasks.finish(task.handle, MoveStatus.COMPLETED)
        made.append(task.handle)
    assert [t.handle for t in tasks.listed(SOURCE)] == made[::-1][:KEPT_TASKS]
    assert tasks.listed(OTHER) == []


def test_only_a_running_task_cancels(tasks):
    task = a_task()
    tasks.start(task)
    tasks.add_moved(task.handle, 4)
    cancelled = tasks.cancel(task.handle)
    assert (cancelled.status, cancelled.moved) == (MoveStatus.CANCELLING, 4)
    assert tasks.cancel(task.handle) is None     # already cancelling
    tasks.finish(task.handle, MoveStatus.CANCELLED)
    assert tasks.cancel(task.handle) is None
    assert tasks.cancel(new_handle(SOURCE)) is None


def test_a_finished_task_stays_as_it_ended(tasks):
    task = a_task()
    tasks.start(task)
    tasks.finish(task.handle, MoveStatus.COMPLETED)
    assert tasks.finish(task.handle, MoveStatus.FAILED, "late").status is MoveStatus.COMPLETED


def test_the_active_tasks_of_every_source_are_found_again(tasks):
    running, cancelling, done = a_task(), a_task(source=OTHER), a_task(
        source="arn:aws:sqs:eu-west-1:123456789012:third")
    for task in (running, cancelling, done):
        tasks.start(task)
    tasks.cancel(cancelling.handle)
    tasks.finish(done.handle, MoveStatus.COMPLETED)
    assert {t.handle for t in tasks.active()} == {running.handle, cancelling.handle}


# -- the mover's loop -----------------------------------------------------------------------
def test_a_task_moves_in_batches_at_its_rate_and_completes(tasks):
    clock, source = FakeClock(), Source(25)
    task = a_task(to_move=25, rate=4)
    tasks.start(task)
    wait, pauses = waiting(clock)
    ended = run(task, tasks, source.batch, clock, wait)
    assert (ended.status, ended.moved) == (MoveStatus.COMPLETED, 25)
    assert source.sizes == [4] * 6 + [1]
    assert clock.monotonic() == pytest.approx(25 / 4)   # 25 messages at 4 a second


def test_without_a_rate_batches_are_full_and_the_default_rate_paces_them(tasks):
    clock, source = FakeClock(), Source(25)
    task = a_task(to_move=25)
    tasks.start(task)
    wait, _ = waiting(clock)
    run(task, tasks, source.batch, clock, wait)
    assert source.sizes == [BATCH, BATCH, 5]
    assert clock.monotonic() == pytest.approx(25 / DEFAULT_RATE_PER_S)


def test_a_task_moves_only_what_the_source_held_when_it_started(tasks):
    source = Source(100)   # 70 arrived after the start
    task = a_task(to_move=30)
    tasks.start(task)
    wait, _ = waiting(FakeClock())
    ended = run(task, tasks, source.batch, FakeClock(), wait)
    assert (ended.status, ended.moved, source.count) == (MoveStatus.COMPLETED, 30, 70)


def test_a_source_emptied_early_completes_the_task(tasks):
    source = Source(12)    # consumers took some meanwhile
    task = a_task(to_move=30)
    tasks.start(task)
    ended = run(task, tasks, source.batch, FakeClock(), waiting(FakeClock())[0])
    assert (ended.status, ended.moved) == (MoveStatus.COMPLETED, 12)


def test_messages_without_a_destination_are_left_and_not_counted_moved(tasks):
    source = Source(20, left=5)
    task = a_task(to_move=20)
    tasks.start(task)
    ended = run(task, tasks, source.batch, FakeClock(), waiting(FakeClock())[0])
    assert (ended.status, ended.moved) == (MoveStatus.COMPLETED, 15)


def test_a_cancel_ends_the_task_after_its_batch(tasks):
    clock, source = FakeClock(), Source(30)
    task = a_task(to_move=30, rate=2)
    tasks.start(task)
    wait, _ = waiting(clock, each=lambda n: n == 3 and tasks.cancel(task.handle))
    ended = run(task, tasks, source.batch, clock, wait)
    assert (ended.status, ended.moved, source.count) == (MoveStatus.CANCELLED, 6, 24)
    assert tasks.listed(SOURCE)[0] == ended


def test_a_lost_queue_fails_the_task_with_sqs_reason(tasks):
    source = Source(30, fail_at=2)
    task = a_task(to_move=30)
    tasks.start(task)
    ended = run(task, tasks, source.batch, FakeClock(), waiting(FakeClock())[0])
    assert (ended.status, ended.moved, ended.failure) == (
        MoveStatus.FAILED, 20, "AWS.SimpleQueueService.NonExistentQueue")


def test_a_stopped_mover_leaves_its_task_running_and_a_second_run_finishes_it(tasks):
    clock, source = FakeClock(), Source(30)
    task = a_task(to_move=30, rate=10)
    tasks.start(task)
    assert run(task, tasks, source.batch, clock, waiting(clock, stop_after=1)[0]) is None
    [again] = tasks.active()
    assert (again.status, again.moved) == (MoveStatus.RUNNING, 10)
    ended = run(again, tasks, source.batch, clock, waiting(clock)[0])
    assert (ended.status, ended.moved, source.count) == (MoveStatus.COMPLETED, 30, 0)


def test_a_task_cancelled_while_its_mover_was_away_ends_cancelled(tasks):
    source = Source(30)
    task = a_task(to_move=30)
    tasks.start(task)
    tasks.cancel(task.handle)
    ended = run(task, tasks, source.batch, FakeClock(), waiting(FakeClock())[0])
    assert (ended.status, ended.moved, source.sizes) == (MoveStatus.CANCELLED, 0, [])


def test_a_batch_refused_after_a_key_rotation_is_made_again_with_the_key_of_now():
    keys = iter(["old", "new"])
    made = []

    def make():
        key = next(keys)
        made.append(key)

        def batch(n, rest=None):
            if key == "old":
                raise AuthError("the signature does not match the account's keys")
            return n, 0, n
        return batch
    batch = signed_anew(make)
    assert batch(3) == (3, 0, 3) and batch(2) == (2, 0, 2)
    assert made == ["old", "new"]  # made again once, then kept


def test_a_batch_refused_with_the_key_of_now_too_fails_its_task():
    def make():
        def batch(n, rest=None):
            raise AuthError("the account is gone")
        return batch
    with pytest.raises(AuthError):
        signed_anew(make)(1)


class RotatingQueues:
    """Queues as two keys reach them: ``old`` is refused by the destination once
    ``rotated`` (the source's shard has not heard of the rotation yet)."""

    def __init__(self, bodies):
        self.source = [FakeReceived(b, f"r{i}") for i, b in enumerate(bodies)]
        self.hidden, self.sent, self.deleted, self.rotated = [], [], [], False

    def target(self, key):
        return FakeTarget(self, key)


class FakeReceived:
    def __init__(self, body, receipt):
        self.body, self.receipt, self.type = body, receipt, "default"


class FakeTarget:
    def __init__(self, queues, key):
        self.queues, self.key = queues, key

    def queue(self, which):
        return FakeQueue(self, which)

    def ordered(self, which):
        return False


class FakeQueue:
    def __init__(self, target, which):
        self.target, self.which = target, which

    def receive(self, max_messages, visibility_timeout_s):
        queues = self.target.queues
        got, queues.source = queues.source[:max_messages], queues.source[max_messages:]
        queues.hidden += got
        queues.rotated = True  # the key is rotated just after this receive
        return got

    def send_batch(self, messages):
        if self.target.key == "old" and self.target.queues.rotated:
            raise AuthError("the signature does not match the account's keys")
        self.target.queues.sent += [m.body for m in messages]

    def delete_batch(self, receipts):
        self.target.queues.deleted += receipts


def test_a_batch_refused_after_its_receive_moves_what_it_received_with_the_key_of_now():
    """Shards learn a key rotation each at its own moment: a batch whose receive passed
    with the old key and whose send was refused goes on with the new key, with the
    messages it received (not left hidden in the source, and not received again)."""
    from rayq.sqs.moves import move_batch

    queues = RotatingQueues(["a", "b", "c"])
    keys = iter(["old", "new"])

    def make():
        t = queues.target(next(keys))
        return lambda n, rest=None: move_batch(t, "source", "destination", n, rest)
    batch = signed_anew(make)
    assert batch(2) == (2, 0, 2)
    assert queues.sent == ["a", "b"] and queues.deleted == ["r0", "r1"]
    assert [m.body for m in queues.source] == ["c"]  # received once, not twice
