"""A data directory rayq makes is its owner's alone: after a start and some traffic
(messages, a task, the SQS endpoint, the event log, a seeding copy) every folder under it
is 0700 and every file 0600, whatever the umask; one others can read, at its top or
anywhere inside, is refused at start. (What a Spark report leaves there is checked where
test_report.py runs one.)"""

import os
import stat

import pytest
import ray

import rayq
from rayq.runtime.local import free_port
from rayq.runtime.serving import stop_sqs
from tests.integration.conftest import wait_until
from tests.modes import exposed_under, modes_under


@rayq.task(type="private-add")
def add(a, b):
    return a + b


def test_everything_under_a_fresh_data_directory_is_the_owners_alone(ray_session, tmp_path):
    rayq.shutdown()
    data_dir = tmp_path / "fresh" / "data"
    client = rayq.start(data_dir=data_dir)
    try:
        queue = client.create_queue("private")
        queue.send("secret", tenant="acme")
        (received,) = queue.receive(wait_s=10)
        queue.delete(received.receipt)
        assert ray.get(client.submit(add, 1, 2, tenant="acme"), timeout=60) == 3
        client.create_account("acme")
        rayq.serve_sqs(port=free_port())
        wait_until(lambda: os.path.isdir(data_dir / "events")
                   and any(f.endswith(".parquet") for _, _, fs in os.walk(data_dir / "events")
                           for f in fs), what="the event log's first file")
    finally:
        stop_sqs()
        rayq.shutdown()
    seeding_copy(data_dir)
    assert {"manager", "shard-0", "sqs", "events", "seeding-0-n2/data.mdb"} <= set(modes_under(data_dir))
    assert stat.S_IMODE(os.stat(data_dir).st_mode) == 0o700
    assert exposed_under(data_dir) == {}


def seeding_copy(data_dir) -> None:
    """The copy a leader makes to seed a follower, of shard 0's store, under umask 022."""
    from actors.replication.leader import copy_store
    from rayq.core.kit.kv import LmdbKV

    old = os.umask(0o022)
    kv = LmdbKV(data_dir / "shard-0")
    try:
        copy_store(kv, str(data_dir / "seeding-0-n2"))
    finally:
        kv.close()
        os.umask(old)


def test_a_data_directory_with_a_looser_folder_inside_is_refused(ray_session, tmp_path):
    rayq.shutdown()
    data_dir = tmp_path / "restored"
    rayq.start(data_dir=data_dir)
    rayq.shutdown()
    os.chmod(data_dir / "manager", 0o755)  # as a backup restored with the umask's modes
    with pytest.raises(rayq.DataDirExposed, match="manager.*chmod -R go-rwx"):
        rayq.start(data_dir=data_dir)


def test_a_data_directory_others_can_read_is_refused_before_anything_starts(ray_session, tmp_path):
    rayq.shutdown()
    exposed = tmp_path / "exposed"
    exposed.mkdir(mode=0o755)
    os.chmod(exposed, 0o755)
    with pytest.raises(rayq.DataDirExposed, match="chmod"):
        rayq.start(data_dir=exposed)
    assert os.listdir(exposed) == []
