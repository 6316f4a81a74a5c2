"""The Dramatiq side of benchmarks/peers.py: a no-op actor on the benchmark's Redis, with
its results stored there too. Imported by the benchmark and by the `dramatiq` worker
processes it starts; both learn the Redis URL from RAYQ_BENCH_REDIS_URL, because the
worker command line takes only module names."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ["RAYQ_BENCH_REDIS_URL"]
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def noop(i):
    return i
