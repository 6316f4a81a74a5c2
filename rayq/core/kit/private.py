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
    may read, write or enter, and so is everything in it (a data directory restored from a
    backup with looser modes inside is refused as its top would be). Symbolic links are
    not followed: their own mode means nothing."""
    top = os.fspath(path)
    info = os.stat(top)
    if not stat.S_ISDIR(info.st_mode):
        raise DataDirExposed(f"the data directory {top!r} is not a directory")
    _check_owned(top, info, top)
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            inner = os.path.join(folder, name)
            inner_info = os.lstat(inner)
            if not stat.S_ISLNK(inner_info.st_mode):
                _check_owned(inner, inner_info, top)


def _check_owned(path: str, info: os.stat_result, top: str) -> None:
    """Raise DataDirExposed unless ``path`` (``top`` or inside it) is this user's and
    closed to others."""
    what = "the data directory" if path == top else f"{path!r} in the data directory"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise DataDirExposed(f"{what} {top!r} belongs to another user (uid {info.st_uid}); "
                             "use a directory of your own")
    if info.st_mode & _OTHERS:
        raise DataDirExposed(
            f"{what} {top!r} has mode {stat.S_IMODE(info.st_mode):03o}: other users could "
            f"read every message and account key in it. Fix it with `chmod -R go-rwx "
            f"{top}` (the directory itself: chmod 700), then start again")


def make_private_file(path: str | os.PathLike) -> str:
    """Create ``path`` empty (or keep what it holds) with mode 0600, so whatever writes it
    later (a library that follows the umask) writes into a private file; returns it."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE))
    os.chmod(path, FILE_MODE)
    return os.fspath(path)


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
