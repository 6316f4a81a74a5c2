"""File modes under a folder, as the checks that a data directory is its owner's alone
read them."""

import os
import stat


def modes_under(root) -> dict[str, int]:
    """Every path under ``root`` (relative to it): its permission bits."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def exposed_under(root) -> dict[str, str]:
    """The paths under ``root`` that are not their owner's alone (a folder 0700, anything
    else 0600), with their modes in octal."""
    return {path: f"{mode:03o}" for path, mode in modes_under(root).items()
            if mode != (0o700 if os.path.isdir(os.path.join(root, path)) else 0o600)}
