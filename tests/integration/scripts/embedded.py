"""The embedded default as a user gets it: ``rayq.start()`` in a fresh process (run as its
own process by tests/integration/test_embedded.py and benchmarks/dashboard.py).

Prints one JSON line: start-up seconds, what Ray's state API lists, every process of
this Ray session with its RSS and listening sockets, and what rayq left of the job's
own Ray (its namespace, whether its workers' output reaches it, and a named actor of
its own after ``rayq.shutdown()``).

    python tests/integration/scripts/embedded.py DATA_DIR [--no-dashboard] [--spark]

With ``--spark`` the report's Spark (RayDP) runs while the sockets are listed.
"""

import json
import sys
import time

import psutil


@__import__("rayq").task(type="echo")
def echo(x):
    return x


class Cache:
    """A job's own named actor, in the job's namespace."""

    def get(self) -> str:
        return "cached"


def session_processes(session_dir: str) -> list[psutil.Process]:
    """This process (the driver, and Spark's JVM if any) and every process of its Ray."""
    from rayq.runtime.local import session_processes as of_session

    me = psutil.Process()
    found = {p.pid: p for p in [me, *me.children(recursive=True), *of_session(session_dir)]}
    return list(found.values())


def describe(proc: psutil.Process) -> dict | None:
    try:
        with proc.oneshot():
            return {"pid": proc.pid, "name": " ".join(proc.cmdline())[:160],
                    "rss_bytes": proc.memory_info().rss,
                    "pss_bytes": proc.memory_full_info().pss,
                    "listen": sorted({c.laddr.ip for c in proc.net_connections(kind="inet")
                                      if c.status == psutil.CONN_LISTEN})}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None  # a worker that exited meanwhile


def start_spark():
    """The report's Spark session on this Ray, with one job run."""
    from rayq.analytics.report import spark_session
    from rayq.config import AnalyticsConfig

    spark = spark_session(AnalyticsConfig())
    assert spark.range(100).count() == 100
    return spark


def main(data_dir: str, dashboard: bool, spark: bool) -> dict:
    started = time.monotonic()
    import ray

    import rayq

    client = rayq.start(data_dir=data_dir, consumers=1, dashboard=dashboard)
    startup_s = time.monotonic() - started
    assert ray.get(client.submit(echo, "ok"), timeout=120) == "ok"
    context = ray.get_runtime_context()
    cache = ray.remote(Cache).options(name="my-cache", num_cpus=0).remote()
    job = {"namespace": context.namespace,
           "log_to_driver": getattr(ray._private.worker.global_worker, "logger_thread",
                                    None) is not None}
    actors = []
    if dashboard:
        from ray.util.state import list_actors

        actors = [a.name for a in list_actors(address=context.gcs_address,
                                              filters=[("state", "=", "ALIVE")])]
    if spark:
        start_spark()
    node = ray._private.worker._global_node
    processes = [d for d in map(describe, session_processes(node.get_session_dir_path())) if d]
    if spark:
        import raydp

        raydp.stop_spark()
    out = {"startup_s": round(startup_s, 2), "dashboard": dashboard,
           "dashboard_url": context.dashboard_url if hasattr(context, "dashboard_url")
           else node.webui_url, "node_ip": node.node_ip_address,
           "actors": sorted(actors), "processes": processes}
    rayq.shutdown()
    job["cache_after_shutdown"] = ray.get(ray.get_actor("my-cache").get.remote(), timeout=60)
    job["namespace_after_shutdown"] = ray.get_runtime_context().namespace
    del cache
    ray.shutdown()
    return {**out, "job": job}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], "--no-dashboard" not in sys.argv, "--spark" in sys.argv)))
