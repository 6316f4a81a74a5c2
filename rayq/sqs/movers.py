"""The SQS endpoint's message move tasks at work: one thread of the endpoint's state actor
per active task (:func:`rayq.sqs.moves.run`).

The state actor is the one place every replica's StartMessageMoveTask and
CancelMessageMoveTask reach, so it keeps the tasks (:class:`rayq.sqs.moves.MoveTasks`, in
its LMDB) and runs them: a task outlives the replica that started it, and a state actor
that restarts runs its RUNNING tasks again (CANCELLING ones end CANCELLED). A mover acts
through a rayq client of the account that started the task, signed with the account's
first key from the manager's directory, so the runtime's gates check it as they check the
account's own requests; a batch refused after the key was rotated is signed anew with
the key of now.
"""

from __future__ import annotations

import logging
import threading
import time

from actors.base import shard_handles
from rayq.client import Client
from rayq.config import Config
from rayq.core.auth.accounts import Signer
from rayq.core.kit.clock import Clock
from rayq.core.kit.kv import KV
from rayq.remote import call, manager_handle
from rayq.sqs import moves
from rayq.sqs.moves import MoveStatus, MoveTask, MoveTasks
from rayq.sqs.sigv4 import Caller
from rayq.sqs.target import Target

log = logging.getLogger(__name__)


class Movers:
    """The move tasks (``tasks``) and a thread running each active one."""

    def __init__(self, kv: KV, config: Config, home_region: str, clock: Clock):
        self.tasks = MoveTasks(kv)
        self._config, self._home, self.clock = config, home_region, clock
        for task in self.tasks.active():  # a restart: go on where they were
            self._spawn(task)

    def start(self, task: MoveTask) -> bool:
        """Record and run ``task``; False while its source has an active task."""
        if not self.tasks.start(task):
            return False
        self._spawn(task)
        return True

    def cancel(self, handle: str) -> MoveTask | None:
        return self.tasks.cancel(handle)

    def _spawn(self, task: MoveTask) -> None:
        threading.Thread(target=self._run, args=(task,), daemon=True,
                         name=f"sqs-move-{task.handle[-8:]}").start()

    def _run(self, task: MoveTask) -> None:
        def mover():  # with the account's key of now (it may be rotated meanwhile)
            t = self._target(task)
            source = t.from_arn(task.source_arn)
            to = t.from_arn(task.destination_arn) if task.destination_arn else None
            return lambda n, rest=None: moves.move_batch(t, source, to, n, rest)
        try:
            moves.run(task, self.tasks, moves.signed_anew(mover), self.clock, _pause)
        except Exception as err:  # the runtime or the account is gone: the task failed
            log.warning("message move task from %s failed: %r", task.source_arn, err)
            self.tasks.finish(task.handle, MoveStatus.FAILED, f"{type(err).__name__}: {err}")

    def _target(self, task: MoveTask) -> Target:
        """The queues as the task's account reaches them."""
        manager = manager_handle()
        keys, _ = call(lambda: manager.directory.remote())
        key = keys[task.account][0]
        client = Client(manager, shard_handles(self._config), self._config,
                        Signer(task.account, key))
        return Target(Caller(task.account, key, task.region), client, "", self._home,
                      lambda: keys)


def _pause(seconds: float) -> bool:
    """A mover's wait between batches: it runs until its task ends or its actor goes."""
    time.sleep(seconds)
    return False
