"""File modes under a folder, as the checks that a data directory is its owner's alone
read them."""

import os
import stat


def _lstat_modes(root) -> dict[str, int]:
    """Every path under ``root`` (relative to it): its whole st_mode, links not followed."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = os.lstat(path).st_mode
    return found


def modes_under(root) -> dict[str, int]:
    """Every path under ``root`` (relative to it): its permission bits."""
    return {path: stat.S_IMODE(mode) for path, mode in _lstat_modes(root).items()}


def exposed_under(root) -> dict[str, str]:
    """The paths under ``root`` that are not their owner's alone (a folder 0700, anything
    else 0600), with their modes in octal."""
    return {path: f"{stat.S_IMODE(mode):03o}" for path, mode in _lstat_modes(root).items()
            if stat.S_IMODE(mode) != (0o700 if stat.S_ISDIR(mode) else 0o600)}
