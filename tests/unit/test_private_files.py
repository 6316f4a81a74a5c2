"""Everything rayq writes under a data directory is its owner's alone (0700 folders,
0600 files) whatever the umask, and a data directory others can read is refused."""

import os
import stat

import pytest

from rayq.analytics.eventlog import EventLog
from rayq.analytics.schema import KINDS
from rayq.core.auth.accounts import Accounts
from rayq.core.kit.kv import LmdbKV
from rayq.core.kit.private import (check_private_dir, check_private_key, make_private_dir,
                                   prepare_data_dir)
from rayq.errors import DataDirExposed, KeyExposed
from tests.modes import exposed_under, modes_under


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the usual default: 0755 folders, 0644 files
    yield
    os.umask(old)


def test_an_lmdb_store_and_its_account_keys_are_the_owners_alone(tmp_path, open_umask):
    kv = LmdbKV(tmp_path / "data" / "manager")
    Accounts(kv).create("acme")
    kv.close()
    modes = modes_under(tmp_path / "data")
    assert set(modes) == {"manager", "manager/data.mdb", "manager/lock.mdb"}
    assert modes["manager"] == 0o700
    assert modes["manager/data.mdb"] == modes["manager/lock.mdb"] == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "data").st_mode) == 0o700


def test_event_log_folders_and_files_are_the_owners_alone(tmp_path, open_umask):
    log = EventLog(str(tmp_path / "events"), "shard-0")
    log.append(sorted(KINDS)[0], 1.0e9)
    assert log.flush() == 1
    assert modes_under(tmp_path / "events") and exposed_under(tmp_path / "events") == {}


def test_a_missing_data_directory_is_made_private(tmp_path, open_umask):
    prepare_data_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o707, 0o770])
def test_a_data_directory_others_may_read_or_enter_is_refused_with_the_fix(tmp_path, mode):
    exposed = tmp_path / "exposed"
    exposed.mkdir()
    os.chmod(exposed, mode)
    with pytest.raises(DataDirExposed, match="chmod"):
        prepare_data_dir(exposed)
    os.chmod(exposed, 0o700)
    check_private_dir(exposed)


@pytest.mark.parametrize("mode, refused", [(0o600, False), (0o400, False), (0o644, True),
                                           (0o640, True), (0o606, True), (0o620, True)])
def test_a_tls_key_others_may_read_or_write_is_refused(tmp_path, mode, refused):
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(mode)
    if refused:
        with pytest.raises(KeyExposed, match="chmod 600"):
            check_private_key(key)
    else:
        check_private_key(key)


@pytest.mark.parametrize("loose, mode", [("manager/data.mdb", 0o644), ("spark", 0o755),
                                         ("events/date=2026-05-04", 0o750),
                                         ("spark/spark.log", 0o604)])
def test_a_data_directory_with_anything_looser_inside_is_refused(tmp_path, loose, mode):
    data = tmp_path / "data"
    for folder in ("manager", "spark", "events/date=2026-05-04"):
        make_private_dir(data / folder)
    for name in ("manager/data.mdb", "spark/spark.log"):
        (data / name).write_bytes(b"")
        (data / name).chmod(0o600)
    check_private_dir(data)  # all private: accepted
    (data / loose).chmod(mode)
    with pytest.raises(DataDirExposed, match=f"{loose}.*chmod -R go-rwx"):
        check_private_dir(data)


def test_sparks_log_folder_and_files_are_the_owners_alone(tmp_path, open_umask):
    from rayq.analytics.report import spark_log_config

    spark_log_config(str(tmp_path / "data" / "spark"))
    modes = modes_under(tmp_path / "data")
    assert modes == {"spark": 0o700, "spark/spark.log": 0o600,
                     "spark/spark-log4j2.properties": 0o600}
