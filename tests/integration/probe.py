"""A detached Ray actor that task handlers report to, so tests can watch consumers work."""

from collections import defaultdict

import ray

PROBE_NAMESPACE = "rayq-test"  # outside "rayq": rayq.shutdown() leaves it alone


@ray.remote(num_cpus=0)
class Probe:
    def __init__(self):
        self.running = defaultdict(int)
        self.peak = defaultdict(int)
        self.attempts = defaultdict(int)
        self.where = defaultdict(list)
        self.spans = []

    def span(self, type_: str, started: float, ended: float) -> None:
        self.spans.append((type_, started, ended))

    def spans_of(self) -> list:
        return list(self.spans)

    def enter(self, type_: str, task_id, consumer: str) -> int:
        self.running[type_] += 1
        self.peak[type_] = max(self.peak[type_], self.running[type_])
        self.attempts[task_id] += 1
        self.where[task_id].append(consumer)
        return self.attempts[task_id]

    def exit(self, type_: str) -> None:
        self.running[type_] -= 1

    def report(self) -> dict:
        return {"peak": dict(self.peak), "attempts": dict(self.attempts), "where": dict(self.where)}


def probe(name: str = "probe"):
    """The probe actor, created if needed and ready before handlers look it up."""
    handle = Probe.options(name=name, namespace=PROBE_NAMESPACE, get_if_exists=True,
                           lifetime="detached").remote()
    ray.get(handle.report.remote())
    return handle


def enter(type_: str, task_id, name: str = "probe") -> int:
    """Called inside a handler: count this attempt, return which attempt it is."""
    handle = ray.get_actor(name, namespace=PROBE_NAMESPACE)
    consumer = ray.get_runtime_context().get_actor_name() or "?"
    return ray.get(handle.enter.remote(type_, task_id, consumer))


def leave(type_: str, name: str = "probe") -> None:
    ray.get(ray.get_actor(name, namespace=PROBE_NAMESPACE).exit.remote(type_))


def record_span(type_: str, started: float, ended: float, name: str = "probe") -> None:
    ray.get(ray.get_actor(name, namespace=PROBE_NAMESPACE).span.remote(type_, started, ended))
