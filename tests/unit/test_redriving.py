"""What ``client.redrive`` makes of its argument, where on a shard dead letters go back
to, and which subqueue pairs a shard's redrive accepts (rayq.redriving,
rayq.core.auth.gate.check_redrive)."""

import pytest

import rayq
from rayq.core.auth.accounts import ADMIN, Place
from rayq.core.auth.gate import check_redrive
from rayq.core.codec.model import SubqueueState
from rayq.core.codec.tasks import TaskSpec
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.errors import AuthError, InvalidMessage, TaskNotFound
from rayq.redriving import source_of, target_on


@rayq.task(type="resize", queue="images")
def resize(image):
    return image


REGISTERED = {"resize": TaskSpec("resize", "images"), "orders": TaskSpec("orders", "work")}


def spec_of(type_):
    return REGISTERED.get(type_)


@pytest.mark.parametrize("what, account, expected", [
    (resize, ADMIN, ("images", "resize")),
    ("resize", ADMIN, ("images", "resize")),
    ("orders", ADMIN, ("work", "orders")),      # a registered type wins over a queue name
    ("orders", "acme", ("orders", None)),       # another account's names are its queues
    ("mail", ADMIN, ("mail", None)),
    ("acme/mail", ADMIN, ("acme/mail", None)),
])
def test_a_task_function_or_a_registered_type_is_a_type_and_any_other_name_a_queue(
        what, account, expected):
    assert source_of(what, account, spec_of) == expected


@pytest.mark.parametrize("what, account, error", [
    (resize, "acme", AuthError),                # task queues are the default account's
    (rayq.task(type="never", queue="q")(lambda: None), ADMIN, TaskNotFound),
    ("mail-dlq", ADMIN, InvalidMessage),        # the queue is named, not its DLQ
    ("not a name!", ADMIN, InvalidMessage),
    (42, ADMIN, InvalidMessage), (None, "acme", InvalidMessage),
])
def test_bad_arguments_are_refused_with_a_clear_error(what, account, error):
    with pytest.raises(error):
        source_of(what, account, spec_of)


def subqueue(id, shard, state=SubqueueState.ALL, version=0, dedicated=None):
    return SubqueueInfo(id, shard, state, version, dedicated)


QUEUE = QueueInfo("orders", (subqueue(1, 0), subqueue(2, 1, SubqueueState.NO_PUT),
                             subqueue(3, 0, version=2), subqueue(4, 2, dedicated=("t", "a")),
                             subqueue(5, 3, SubqueueState.DISABLED)),
                  1, 5, ((0, 10), (1, 11), (2, 12), (3, 13)), 0.0)


@pytest.mark.parametrize("shard, expected", [(0, 3), (1, None), (2, None), (3, None), (4, None)])
def test_dead_letters_go_back_to_the_newest_open_subqueue_on_their_shard_or_nowhere(
        shard, expected):
    assert target_on(QUEUE, shard) == expected


PLACES = {1: Place("acme/orders", "acme", 0), 10: Place("acme/orders-dlq", "acme", 0),
          2: Place("acme/orders", "acme", 1), 11: Place("acme/orders-dlq", "acme", 1),
          20: Place("acme/other", "acme", 0), 21: Place("acme/other-dlq", "acme", 0)}


def test_a_shard_redrives_from_a_queues_dead_letter_subqueue_to_the_queue_on_that_shard():
    check_redrive(PLACES, 10, 1, 0)


@pytest.mark.parametrize("source, target, shard", [
    (1, 10, 0),    # the other way round
    (10, 20, 0),   # to another queue
    (21, 1, 0),    # from another queue's DLQ
    (11, 2, 0),    # subqueues of another shard
    (10, 2, 0), (10, 1, 1), (99, 1, 0), (10, 99, 0),
])
def test_any_other_pair_is_refused(source, target, shard):
    with pytest.raises(InvalidMessage):
        check_redrive(PLACES, source, target, shard)
