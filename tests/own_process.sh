#!/usr/bin/env bash
# Runs the tests marked own_process, after the others: they start and stop Ray with
# `ray start` / `ray stop --force`, and `ray stop` stops every Ray on the machine. As
# root they run in a PID and mount namespace of their own, with a /tmp/ray of their
# own, so they see and stop only their own Ray (and ray.init() elsewhere never finds
# their cluster); tests/reaper.py is that namespace's init, reaping orphans.
# Usage: PY=.venv/bin/python tests/own_process.sh [pytest args]
set -euo pipefail
PY=${PY:-python3}
export REAPER="$(cd "$(dirname "$0")" && pwd)/reaper.py"
if [ "$(id -u)" = 0 ] && unshare --pid --fork --mount-proc --mount true 2>/dev/null; then
    exec unshare --pid --fork --mount-proc --mount bash -c \
        'mkdir -p /tmp/ray && mount -t tmpfs tmpfs /tmp/ray && exec "$0" "$REAPER" "$0" -m pytest -q -m own_process "$@"' \
        "$PY" "$@"
fi
exec "$PY" -m pytest -q -m own_process "$@"
