"""client.redrive on real Ray: dead-lettered tasks run again under their ids once their
cause is fixed, a queue's dead letters move back counted, a type's only, and what is
refused."""

import os

import pytest
import ray
from click.testing import CliRunner

import rayq
from rayq.cli import main
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until

CONFIG = Config(consumers=ConsumerConfig(count=2, visibility_timeout_s=5.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2))


@rayq.task(type="rd_flagged", queue="rd-tasks", max_receives=1)
def flagged(flag, value):
    """Fails until the file ``flag`` exists (the cause of its failures fixed)."""
    if not os.path.exists(flag):
        raise RuntimeError("the flag is not set yet")
    return value


@rayq.task(type="rd_broken", queue="rd-tasks", max_receives=1)
def broken(value):
    raise ValueError(f"never works: {value}")


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="redrive")
    yield client
    rayq.shutdown()


@pytest.fixture
def flag(tmp_path):
    return str(tmp_path / "fixed")


def failed(client, ids):
    for task_id in ids:
        with pytest.raises(rayq.TaskError):
            client.result(task_id, timeout_s=120)
    return all(client.task(task_id).state == "failed" for task_id in ids)


def dead_letter_plain(queue, n):
    """Deliver the ``n`` messages of ``queue`` (max_receives=1) once, unfinished, then
    receive until they all moved to its dead-letter queue."""
    got = []
    wait_until(lambda: got.extend(queue.receive(n, visibility_timeout_s=0)) or len(got) >= n,
               60, what=f"{n} messages delivered once")
    wait_until(lambda: not queue.receive(n, visibility_timeout_s=0) and queue.count() == 0,
               60, what="every message dead-lettered")


def test_dead_lettered_tasks_redriven_once_fixed_run_again_and_their_ids_give_the_values(
        client, flag):
    ids = [f"rd-fix-{i}" for i in range(3)]
    refs = [client.submit(flagged, flag, i * 10, task_id=task_id) for i, task_id in enumerate(ids)]
    assert failed(client, ids)
    dlq = client.queue("rd-tasks-dlq")
    wait_until(lambda: dlq.count() == 3, 60, what="three tasks in the dead-letter queue")
    open(flag, "w").close()
    assert client.redrive(flagged) == 3
    assert [client.result(task_id, timeout_s=120) for task_id in ids] == [0, 10, 20]
    for task_id in ids:
        info = client.task(task_id)
        assert (info.state, info.attempts) == ("succeeded", 1)
    assert ray.get(client.ref(ids[1]), timeout=60) == 10
    again = client.submit(flagged, flag, 99, task_id=ids[2])  # the same task: not run anew
    assert ray.get(again, timeout=60) == 20
    with pytest.raises(rayq.TaskError, match="not set yet"):  # resolved refs keep their error
        ray.get(refs[0], timeout=60)
    assert dlq.count() == 0 and client.redrive(flagged) == 0


def test_a_type_redrive_moves_that_types_tasks_only_and_a_type_is_named_by_its_name(
        client, flag):
    fixable = [f"rd-only-{i}" for i in range(2)]
    doomed = [f"rd-doomed-{i}" for i in range(2)]
    for i, task_id in enumerate(fixable):
        client.submit(flagged, flag, i, task_id=task_id)
    for i, task_id in enumerate(doomed):
        client.submit(broken, i, task_id=task_id)
    assert failed(client, fixable + doomed)
    dlq = client.queue("rd-tasks-dlq")
    wait_until(lambda: dlq.count() == 4, 60, what="four tasks in the dead-letter queue")
    open(flag, "w").close()
    assert client.redrive("rd_flagged") == 2
    assert [client.result(task_id, timeout_s=120) for task_id in fixable] == [0, 1]
    assert dlq.count() == 2 and all(client.task(t).state == "failed" for t in doomed)
    assert client.redrive(broken, max_messages=1) == 1
    wait_until(lambda: dlq.count() == 2 and all(client.task(t).state == "failed" for t in doomed),
               120, what="the redriven broken task dead-lettered again")
    assert client.redrive(broken) == 2
    wait_until(lambda: dlq.count() == 2 and all(client.task(t).state == "failed" for t in doomed),
               120, what="both broken tasks dead-lettered again")


def test_a_queue_redrive_moves_up_to_max_messages_visible_again_with_their_receive_count_reset(
        client):
    queue = client.create_queue("rd-orders", max_receives=1)
    sent = [queue.send({"n": i}, tenant="acme", type="order") for i in range(5)]
    dead_letter_plain(queue, 5)
    dlq = client.queue("rd-orders-dlq")
    assert dlq.count() == 5
    assert client.redrive("rd-orders", max_messages=2) == 2
    assert (queue.count(), dlq.count()) == (2, 3)
    assert client.redrive("rd-orders") == 3
    back = queue.receive(10, visibility_timeout_s=30)
    assert sorted(m.id for m in back) == sorted(sent)
    assert all(m.dequeue_count == 1 and m.tenant == "acme" and m.type == "order" for m in back)
    assert sorted(m.body["n"] for m in back) == list(range(5))


def test_a_dead_letter_held_by_a_receiver_of_the_dead_letter_queue_stays_with_it(client):
    queue = client.create_queue("rd-held", max_receives=1)
    queue.send("a")
    queue.send("b")
    dead_letter_plain(queue, 2)
    dlq = client.queue("rd-held-dlq")
    [held] = dlq.receive(1, visibility_timeout_s=300)
    assert client.redrive("rd-held") == 1
    dlq.delete(held.receipt)  # its receipt still holds: nobody moved it under its receiver
    assert (queue.count(), dlq.count()) == (1, 0)


def test_an_account_redrives_its_own_queues_and_the_admin_any(client):
    acme = rayq.connect(account="rdacme", key=client.create_account("rdacme"))
    queue = acme.create_queue("orders", max_receives=1)
    for body in ("x", "y"):
        queue.send(body)
    dead_letter_plain(queue, 2)
    assert acme.redrive("orders", max_messages=1) == 1
    assert client.redrive("rdacme/orders") == 1
    assert queue.count() == 2
    client.create_queue("rd-admins", max_receives=1)
    with pytest.raises(rayq.QueueNotFound):
        acme.redrive("default/rd-admins")
    with pytest.raises(rayq.AuthError):
        acme.redrive(flagged)  # task queues are the default account's
    with pytest.raises(rayq.QueueNotFound):
        acme.redrive("rd_flagged")  # another account's names are its queues only


@pytest.mark.parametrize("what, max_messages, error", [
    ("rd-no-such-queue", None, rayq.QueueNotFound),
    ("rd-orders-dlq", None, rayq.InvalidMessage),
    ("not a queue!", None, rayq.InvalidMessage),
    (42, None, rayq.InvalidMessage),
    ("rd-tasks", 0, rayq.InvalidMessage),
    ("rd-tasks", "all", rayq.InvalidMessage),
    (rayq.task(type="rd_never_registered", queue="rd-tasks")(lambda: None), None,
     rayq.TaskNotFound),
])
def test_bad_arguments_raise_clear_errors(client, what, max_messages, error):
    client.create_queue("rd-orders", max_receives=1)
    with pytest.raises(error):
        client.redrive(what, max_messages=max_messages)


def test_a_disabled_queue_takes_no_redrive_and_keeps_its_dead_letters(client):
    queue = client.create_queue("rd-off", max_receives=1)
    queue.send("kept")
    dead_letter_plain(queue, 1)
    queue.disable()
    with pytest.raises(rayq.QueueDisabled):
        client.redrive("rd-off")
    assert client.queue("rd-off-dlq").count() == 1
    queue.enable()
    assert client.redrive("rd-off") == 1


def test_the_redrive_command_moves_dead_letters_back_and_says_how_many(client):
    queue = client.create_queue("rd-cli", max_receives=1)
    for body in ("1", "2", "3"):
        queue.send(body)
    dead_letter_plain(queue, 3)
    done = CliRunner().invoke(main, ["redrive", "rd-cli", "--max", "2"])
    assert done.exit_code == 0, done.output
    assert "moved 2" in done.output
    done = CliRunner().invoke(main, ["redrive", "rd-cli"])
    assert "moved 1" in done.output and queue.count() == 3
    refused = CliRunner().invoke(main, ["redrive", "rd-cli-missing"])
    assert refused.exit_code == 1 and "rd-cli-missing" in refused.output
