"""The first process of the own-process tests' PID namespace: runs its arguments as a
child and, as an init does, reaps every process orphaned into the namespace, so that
stopped Ray processes do not stay zombies (``ray stop`` waits for zombies to exit).
Exits with the child's status. Usage: python tests/reaper.py COMMAND [ARGS...]"""

import os
import signal
import subprocess
import sys


def main() -> int:
    child = subprocess.Popen(sys.argv[1:])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: child.send_signal(signum))
    while True:  # the child is not reaped until it ends, so there is always one to wait for
        pid, status = os.wait()
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
