"""How the SQS endpoint serves HTTP on Ray: aiohttp inside actors vs a Ray Serve deployment.

    python benchmarks/http_server.py [--seconds 4] [--rounds 5] [--threads 4]

Both serve the same handler: read the body, make one call to a Ray actor (as
the endpoint calls a shard), answer with a little JSON. Requests come from
``--threads`` keep-alive HTTP sessions. Ray Serve routes each request through
its proxy actor to a replica; the aiohttp actor answers on the socket itself.
The endpoint (rayq/sqs/service.py) uses whichever is faster here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import sys
import threading

# Its sibling http.py would shadow the standard library's http package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import ray  # noqa: E402
import requests  # noqa: E402
from aiohttp import web  # noqa: E402

_spec = importlib.util.spec_from_file_location("_report", os.path.join(_HERE, "_report.py"))
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@ray.remote(num_cpus=0)
class Echo:
    async def echo(self, data: bytes) -> bytes:
        return data


class AioServer:
    def __init__(self, port: int, echo):
        self.echo = echo
        self.listening = asyncio.get_running_loop().create_task(self._listen(port))

    async def _listen(self, port: int) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True).start()

    async def handle(self, request: web.Request) -> web.Response:
        data = await self.echo.echo.remote(await request.read())
        return web.Response(body=json.dumps({"bytes": len(data)}).encode())

    async def ready(self) -> bool:
        await self.listening
        return True


def requests_per_s(url: str, seconds: float, threads: int) -> float:
    stop = threading.Event()
    counts = [0] * threads

    def run(i: int) -> None:
        session = requests.Session()
        while not stop.is_set():
            session.post(url, data=b"x" * 300, timeout=60).raise_for_status()
            counts[i] += 1
    requests_per_s_warm(url)
    elapsed = _report.run_threads(run, threads, seconds, stop)
    return sum(counts) / elapsed


def requests_per_s_warm(url: str) -> None:
    with requests.Session() as session:
        for _ in range(20):
            session.post(url, data=b"x", timeout=60).raise_for_status()


def serve_deployment(echo) -> str:
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Handler:
        def __init__(self, echo):
            self.echo = echo

        async def __call__(self, request):
            data = await self.echo.echo.remote(await request.body())
            return {"bytes": len(data)}

    serve.run(Handler.bind(echo), route_prefix="/")
    return f"http://127.0.0.1:{port}/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="per round and server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    _report.local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        echo = Echo.remote()
        port = free_port()
        server = ray.remote(AioServer).options(num_cpus=0).remote(port, echo)
        ray.get(server.ready.remote())
        urls = {"aiohttp": f"http://127.0.0.1:{port}/", "serve": serve_deployment(echo)}
        # Rounds alternate between the two so that the shared machine's load swings hit both.
        rates = {name: [] for name in urls}
        for _ in range(args.rounds):
            for name, url in urls.items():
                rates[name].append(requests_per_s(url, args.seconds, args.threads))
    finally:
        ray.shutdown()
    aio, serve = (statistics.median(rates[name]) for name in ("aiohttp", "serve"))
    _report.report("http_server", [
        {"figure": "aiohttp in a Ray actor, 1 actor call/request (median of rounds)",
         "value": aio, "unit": "req/s", "baseline": "Ray Serve deployment, same handler",
         "baseline_value": serve}],
        {"seconds": args.seconds, "rounds": args.rounds, "threads": args.threads,
         "rounds_req_per_s": rates})


if __name__ == "__main__":
    main()
