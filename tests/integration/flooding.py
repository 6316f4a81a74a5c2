"""What the flood tests share: batched sends of one tenant, and a receiver thread."""

import threading
from collections import Counter

import rayq


def send(queue, tenant: str, n: int) -> list[str]:
    """Send ``n`` messages of type "job" as ``tenant``, 100 a batch; their ids."""
    ids = []
    for start in range(0, n, 100):
        ids += queue.send_batch([rayq.Outgoing(f"{tenant}-{i}", tenant=tenant, type="job")
                                 for i in range(start, min(n, start + 100))])
    return ids


class Receiver:
    """Receives and deletes in a thread; counts every delivery of every id."""

    def __init__(self, name: str):
        self.deliveries: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(name,), daemon=True)
        self._thread.start()

    def _run(self, name: str) -> None:
        q = rayq.connect().queue(name)
        while not self._stop.is_set():
            got = q.receive(max_messages=100, visibility_timeout_s=60, wait_s=0.2)
            self.deliveries.update(m.id for m in got)
            if got:
                q.delete_batch([m.receipt for m in got])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
