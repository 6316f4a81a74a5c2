"""Files only their owner reads: the data directory holds every message and every
account key, so everything rayq creates in it is mode 0700 (folders) or 0600 (files),
whatever the process's umask, and a data directory others can read is refused.
"""

from __future__ import annotations

import os
import stat

from rayq.errors import DataDirExposed, KeyExposed

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def make_private_dir(path: str | os.PathLike) -> str:
    """Create ``path`` and its missing parents with mode 0700 (a parent that exists is
    left as it is); returns the path. An existing ``path`` is not changed."""
    path = os.fspath(path)
    missing = []
    head = os.path.abspath(path)
    while not os.path.exists(head):
        missing.append(head)
        head = os.path.dirname(head)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, DIR_MODE)  # mkdir's mode is masked by the umask; 0700 is wanted
    return path


def check_private_dir(path: str | os.PathLike) -> None:
    """Raise DataDirExposed unless ``path`` is a folder of this user that no other user
    may read, write or enter."""
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise DataDirExposed(f"the data directory {os.fspath(path)!r} is not a directory")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise DataDirExposed(f"the data directory {os.fspath(path)!r} belongs to another user "
                             f"(uid {info.st_uid}); use a directory of your own")
    if info.st_mode & _OTHERS:
        raise DataDirExposed(
            f"the data directory {os.fspath(path)!r} has mode {stat.S_IMODE(info.st_mode):03o}: "
            f"other users could read every message and account key in it. Fix it with "
            f"`chmod -R go-rwx {os.fspath(path)}` (the directory itself: chmod 700), then start again")


def check_private_key(path: str | os.PathLike) -> None:
    """Raise KeyExposed unless the private key file ``path`` is this user's and no other
    user may read or write it (0600 or 0400, as ssh asks of its keys)."""
    info = os.stat(path)
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise KeyExposed(f"the TLS key {os.fspath(path)!r} belongs to another user "
                         f"(uid {info.st_uid}); use a key file of your own")
    if info.st_mode & _OTHERS:
        raise KeyExposed(
            f"the TLS key {os.fspath(path)!r} has mode {stat.S_IMODE(info.st_mode):03o}: other "
            f"users could read it and pose as the endpoint. Fix it with "
            f"`chmod 600 {os.fspath(path)}`, then serve again")


def prepare_data_dir(path: str | os.PathLike) -> str:
    """The data directory, created 0700 if missing; refused (DataDirExposed) if others
    may read it. Returns the path."""
    make_private_dir(path)
    check_private_dir(path)
    return os.fspath(path)
