"""The ``rayq`` command: start, stop, demo, report, status, drain, redrive, account and
serve."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import rayq
import rayq.config
from rayq.runtime.session import quiet_workers

console = Console()


NO_RUNTIME = "no rayq runtime is running here; start one with `rayq start`"
TOKEN_MODE_ENV = "RAY_AUTH_MODE"  # Ray's CLI and job client use ~/.ray/auth_token when "token"
NAME_ENV = "RAYQ_NAME"  # the runtime the commands start or talk to (Config.name)


@click.group()
@click.option("--name", default=None, envvar=NAME_ENV,
              help="The runtime to start or talk to (Config.name; default rayq): runtimes of "
                   "other names on the same Ray cluster are left alone.")
def main(name: str | None) -> None:
    """rayq: a durable, multi-tenant queue and fair scheduling runtime on Ray."""
    if name is not None:
        from rayq.names import serve

        try:
            serve(rayq.Config(name=name).name)
        except rayq.ConfigError as err:
            raise click.ClickException(str(err)) from None
        os.environ[NAME_ENV] = name  # the configuration rayq start loads takes it too
    # A quiet console: Ray's Python warnings, and what the runtime's actors print, stay
    # in Ray's log files (this process is rayq's own, not a job's).
    os.environ.setdefault("RAYQ_RAY_LOG_LEVEL", "ERROR")
    quiet_workers()


def _connect():
    """The running runtime's client, or one line saying there is none (exit 1)."""
    try:
        return rayq.connect()
    except (ConnectionError, rayq.RuntimeFailure) as err:
        import ray

        ray.shutdown()
        raise click.ClickException(f"{NO_RUNTIME} ({err})" if isinstance(err, ConnectionError)
                                   and "multiple" in str(err) else NO_RUNTIME) from None


@main.command()
@click.option("--data-dir", default=None, help="Where shards keep their data (default ./.rayq-data).")
@click.option("--consumers", default=None, type=int, help="Consumer actors to run.")
@click.option("--port", default=0, help="The Ray head's port (default: a free one).")
@click.option("--dashboard/--no-dashboard", default=True, show_default=True,
              help="Run the Ray dashboard (on 127.0.0.1).")
@click.option("--warm-report", is_flag=True, default=False,
              help="Start Spark for reports now, in the background (it holds an executor's CPU "
                   "until AnalyticsConfig.idle_stop_s passes without a report).")
def start(data_dir: str | None, consumers: int | None, port: int, dashboard: bool,
          warm_report: bool) -> None:
    """Start a Ray head on 127.0.0.1 and the runtime's actors, detached: they run until
    `rayq stop`, and scripts, `rayq status` and Ray jobs on this machine attach to them."""
    import subprocess

    import ray

    from rayq.core.kit.private import prepare_data_dir
    from rayq.runtime import local
    from rayq.runtime.session import default_data_dir, live_cluster

    config = rayq.config.load()
    data_dir = data_dir or default_data_dir(config)
    try:  # before a Ray head starts: a refused data directory leaves nothing running
        prepare_data_dir(os.path.abspath(data_dir))
    except rayq.DataDirExposed as err:
        raise click.ClickException(str(err)) from None
    try:
        address = live_cluster(None, say=lambda line: console.print(line, soft_wrap=True))
    except rayq.RuntimeFailure as err:  # $RAY_ADDRESS names a Ray that does not answer
        raise click.ClickException(str(err)) from None
    started = address is None
    if started:
        try:
            address = local.start_head(port, dashboard)
        except subprocess.CalledProcessError as err:
            raise click.ClickException(f"ray start failed: {(err.stderr or err.stdout).strip()[-2000:]}")
    try:
        client = rayq.start(data_dir=data_dir, config=config, consumers=consumers)
    except (ConnectionError, rayq.RuntimeFailure) as err:
        raise click.ClickException(f"the Ray at {address} does not answer: {err}") from None
    node = ray._private.worker.global_worker.node
    if started:
        local.mark_started(node.get_session_dir_path())
    count = len(client.consumer_stats())
    where = os.path.abspath(data_dir)
    if warm_report:
        from actors.analytics import warm_up

        warm_up(client.config, where)
    token = _token_auth()
    ray.shutdown()
    console.print(f"rayq runtime running on Ray at {address} "
                  f"({'started' if started else 'already running'}); data in {where}, "
                  f"{count} consumer(s)", soft_wrap=True)
    console.print("Attach from this machine: rayq.connect() in Python, or `rayq status`; "
                  "stop with `rayq stop` (the data stays).", soft_wrap=True)
    if node.webui_url:
        _print_jobs(f"http://{node.webui_url}", token)


def _token_auth() -> bool:
    """Whether the Ray this process attached to checks an auth token."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    return is_token_auth_enabled()


def _print_jobs(dashboard_url: str, token: bool) -> None:
    """The dashboard's address and how to submit a Ray job to it from a shell here
    (Ray's CLI reads the token in ~/.ray/auth_token only when told the mode)."""
    console.print(f"Ray dashboard: {dashboard_url}", soft_wrap=True)
    console.print("Submit Ray jobs from this machine (rayq.connect() inside them):")
    exports = [f"export {TOKEN_MODE_ENV}=token"] if token else []
    for line in [*exports, f"ray job submit --address {dashboard_url} --working-dir . -- python job.py"]:
        console.print(f"  {line}", soft_wrap=True, highlight=False)


def _start(**kwargs):
    """rayq.start; a refused data directory is one line saying how to fix it."""
    try:
        return rayq.start(**kwargs)
    except rayq.DataDirExposed as err:
        raise click.ClickException(str(err)) from None


@main.command()
def stop() -> None:
    """Stop the runtime's actors and the Ray head `rayq start` started; the data stays."""
    import ray

    from rayq.runtime import local

    _connect()
    node = ray._private.worker.global_worker.node
    session_dir, address = node.get_session_dir_path(), node.address
    rayq.shutdown()
    from actors.lifecycle import runtimes_running

    others = runtimes_running()
    ray.shutdown()
    if not local.started_by_rayq(session_dir) or others:
        why = (f"other rayq runtimes use it ({', '.join(others)})" if others
               else "it was not started by `rayq start`")
        console.print(f"rayq runtime stopped; the Ray at {address} keeps running: {why}")
        return
    stopped = local.stop_session(session_dir, address)
    killed = f", {stopped.killed} killed as they did not exit" if stopped.killed else ""
    console.print(f"rayq runtime and its Ray head at {address} stopped ({stopped.processes} "
                  f"processes{killed}); the data stays")


@main.command()
@click.option("--data-dir", default=None, help="Where shards keep their data (default ./.rayq-data).")
@click.option("--tasks", default=3000, show_default=True, help="Tasks to submit.")
@click.option("--consumers", default=2, show_default=True, help="Consumer actors to run.")
def demo(data_dir: str | None, tasks: int, consumers: int) -> None:
    """Run a multi-tenant task workload on the embedded runtime and summarise it."""
    from rayq.demo import submit_workload, wait_all

    started = time.monotonic()
    # The demo lasts seconds, not hours: fairness windows scaled down to match.
    config = rayq.config.load()
    config = dataclasses.replace(
        config, fairness=dataclasses.replace(config.fairness, window_s=5.0,
                                             latency_threshold_s=2.0, interval_s=1.0),
        analytics=dataclasses.replace(config.analytics, window_s=5.0))
    client = _start(data_dir=data_dir, consumers=consumers, config=config)
    console.print(f"runtime up in {time.monotonic() - started:.1f}s with {consumers} consumers")
    t0 = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        submitted = progress.add_task("submitting", total=tasks)
        refs = submit_workload(client, tasks)
        progress.update(submitted, completed=tasks)
        done = progress.add_task("running", total=tasks)
        failed = wait_all(refs, on_done=lambda n: progress.advance(done, n))
    elapsed = time.monotonic() - t0
    for by in ("tenant", "type"):
        console.print(_tally_table(client.task_stats(by=by), by))
    console.print(f"{tasks} tasks submitted durably and run in {elapsed:.1f}s "
                  f"({tasks / elapsed:,.0f} tasks/s), {failed} failed; consumers (load, hit rate): "
                  + ", ".join(f"#{s.index} ({s.load}, {s.hit_rate:.2f})"
                              for s in client.consumer_stats()))
    fair = client.fairness()
    decisions = [e for e in fair.history if e["kind"] == "fairness"]
    console.print(f"fairness: {len(decisions)} evaluations, intervened in "
                  f"{sum(e['intervening'] for e in decisions)}; now intervening: {fair.intervening}, "
                  f"offenders: {sorted(fair.offenders) or 'none'}")
    _report(client, os.path.join(os.path.dirname(os.path.abspath(data_dir or ".rayq-data")),
                                 "rayq-report"))
    rayq.shutdown()


def _tally_table(rows, by: str) -> Table:
    table = Table(title=f"rayq demo: tasks per {by}")
    for column in (by, "completed", "deferred", "usage s", "usage share", "wait p50 s", "wait p99 s"):
        table.add_column(column, justify="left" if column == by else "right")
    total = sum(r.usage_s for r in rows) or 1.0
    for r in rows:
        table.add_row(getattr(r, by), str(r.succeeded), str(r.deferred), f"{r.usage_s:.2f}",
                      f"{r.usage_s / total:.0%}", f"{r.wait_p50_s:.3f}", f"{r.wait_p99_s:.3f}")
    return table


@main.command()
@click.option("--out", "out_dir", default="rayq-report", show_default=True,
              help="Where the tables, plots and report.html go.")
def report(out_dir: str) -> None:
    """Analyse the running runtime's event log with Spark (RayDP) and write a report."""
    _report(_connect(), out_dir)


def _report(client, out_dir: str):
    """Run the report under one progress bar over its steps; a failure is one line
    (with Spark's log file when Spark failed). Spark runs in the runtime's analytics
    actor: its output goes to Ray's logs and its own log file, not to this console."""
    from rayq.analytics.report import STEPS

    columns = (TextColumn("report"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    try:
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("", total=STEPS)
            result = client.report(out_dir, progress=lambda step: progress.update(
                bar, advance=1, description=step))
            progress.update(bar, completed=STEPS, description="done")
    except rayq.RayqError as err:
        raise click.ClickException(str(err)) from None
    console.print(f"report of {result.events:,} events in {result.seconds:.0f}s: {result.html}")
    return result


@main.command()
@click.option("--watch", default=0.0, help="Refresh every this many seconds (0: print once).")
def status(watch: float) -> None:
    """Queues, shards, consumers, fairness victims and flooders of a running runtime."""
    client = _connect()
    if not watch:
        console.print(_status(client))
        return
    with Live(_status(client), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(watch)
            live.update(_status(client))


@main.command()
@click.argument("node")
@click.option("--cancel", is_flag=True, help="Let the node take copies again.")
@click.option("--wait", "wait_s", default=600.0, show_default=True,
              help="Seconds to wait for the node to hold nothing.")
def drain(node: str, cancel: bool, wait_s: float) -> None:
    """Move every copy and leadership off data node NODE, before removing it."""
    client = _connect()
    try:
        if cancel:
            client.undrain(node)
            console.print(f"{node} takes copies again")
            return
        client.drain(node, wait_s=wait_s)
    except rayq.RayqError as err:
        raise click.ClickException(str(err)) from None
    console.print(f"{node} holds no copy: it can be removed")


@main.command()
@click.argument("name")
@click.option("--max", "max_messages", default=None, type=click.IntRange(min=1),
              help="Move at most this many (default: all there now).")
def redrive(name: str, max_messages: int | None) -> None:
    """Move the dead letters of NAME back: a registered task type's dead-lettered tasks
    to its queue, to run again, or queue NAME's (`account/name` for another account's)
    from NAME-dlq."""
    client = _connect()
    try:
        moved = client.redrive(name, max_messages=max_messages)
    except rayq.RayqError as err:
        raise click.ClickException(str(err)) from None
    console.print(f"moved {moved} back from the dead-letter queue")


@main.command()
def schedules() -> None:
    """The default account's schedules: cadence, next tick and last firing (UTC)."""
    table = _table("schedules", "name", "calls", "when", "next (UTC)", "last fired (UTC)")
    for s in _connect().schedules():
        when = f"every {s.every_s:g}s" if s.every_s is not None else f"cron {s.cron}"
        table.add_row(s.name, f"{s.type} as {s.tenant}", when, _utc(s.next_at),
                      "-" if s.last_fired_at is None else _utc(s.last_fired_at))
    console.print(table)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


@main.group()
def account() -> None:
    """Accounts of a running runtime (run where the default account's client works)."""


@account.command("create")
@click.argument("name")
def account_create(name: str) -> None:
    """Create account NAME and print its key (shown once: hand it to the account)."""
    key = _connect().create_account(name)
    click.echo(key)
    click.echo(f"account {name!r} created; connect with "
               f"rayq.connect(account={name!r}, key=<the key above>)", err=True)


@account.command("rotate")
@click.argument("name")
@click.option("--slot", type=click.IntRange(1, 2), default=1, show_default=True,
              help="Which of the two keys to replace; the other keeps working.")
def account_rotate(name: str, slot: int) -> None:
    """Replace one key of account NAME and print the new one."""
    click.echo(_connect().rotate_key(slot, account=name))


@account.command("keys")
@click.argument("name")
@click.option("--slot", type=click.IntRange(1, 2), default=1, show_default=True,
              help="Which key slot to fill (a key already there is replaced).")
def account_keys(name: str, slot: int) -> None:
    """Give account NAME a key in SLOT and print it. The default account has none until
    given one here: its SQS clients, or signed clients acting as admin, need one."""
    click.echo(_connect().rotate_key(slot, account=name))


@account.command("quota")
@click.argument("name")
@click.option("--queues", type=click.IntRange(0), default=None, help="Queues it may own.")
@click.option("--messages", type=click.IntRange(0), default=None,
              help="Messages its queues may hold.")
@click.option("--bytes", "bytes_", type=click.IntRange(0), default=None,
              help="Bytes of bodies its queues may hold.")
def account_quota(name: str, queues: int | None, messages: int | None,
                  bytes_: int | None) -> None:
    """Set account NAME's quota (a limit left out is unlimited: no options, no quota)."""
    quota = _connect().set_quota(name, queues=queues, messages=messages, bytes=bytes_)
    click.echo(" ".join(f"{limit}={'unlimited' if value is None else value}"
                        for limit, value in vars(quota).items()))


@main.command()
@click.option("--data-dir", default=None, help="Where shards keep their data (default ./.rayq-data).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=9324, show_default=True)
@click.option("--replicas", type=click.IntRange(1, 64), default=1, show_default=True,
              help="HTTP actors per node, sharing the port.")
@click.option("--tls-cert", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")
@click.option("--tls-key", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The PEM private key of --tls-cert.")
@click.option("--home-region", default="us-east-1", show_default=True,
              help="The region whose SQS queues are rayq's queues of the same names.")
def serve(data_dir: str | None, host: str, port: int, replicas: int, tls_cert: str | None,
          tls_key: str | None, home_region: str) -> None:
    """Serve the Amazon SQS API (JSON and Query protocols, SigV4) until interrupted. Starts the
    embedded runtime unless RAY_ADDRESS names a cluster whose runtime it then uses."""
    from rayq.runtime.serving import stop_sqs

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    _start(data_dir=data_dir)
    url = rayq.serve_sqs(host=host, port=port, replicas=replicas, tls_cert=tls_cert,
                         tls_key=tls_key, home_region=home_region)
    click.echo(url)
    click.echo("access key id: an account name (or its key's AKIA id); secret: its key "
               "(rayq account create NAME)", err=True)
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop acts as Ctrl-C
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop_sqs()
        if not os.environ.get("RAY_ADDRESS"):  # the embedded runtime goes with this process
            rayq.shutdown()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _status(client) -> Group:
    queues = _table("queues", "queue", "state", "depth", "subqueues", "oldest age s", "metadata")
    for name in client.list_queues():
        queue = client.queue(name)
        stats, meta = queue.stats(), queue.metadata()
        oldest = max((k.oldest_age_s for k in stats.keys.values()), default=0.0)
        queues.add_row(name, "enabled" if meta.enabled else "disabled", str(stats.depth),
                       str(len(stats.subqueues)), f"{oldest:.1f}",
                       ", ".join(f"{k}={v}" for k, v in meta.metadata.items()) or "-")
    shards = _table("shards", "shard", "node", "role", "messages", "calls/commit", "cache MiB",
                    "hits", "bypasses", "pressure", "spilled")
    for s in client.stats():
        c = s.store.cache
        shards.add_row(str(s.index), s.node or "local", s.role, str(s.store.messages),
                       f"{s.calls_committed / max(1, s.commits):.1f}", f"{c.bytes / 2**20:.1f}",
                       str(c.hits), str(c.bypasses), "yes" if c.under_pressure else "no",
                       str(s.store.spilled))
    consumers = _table("consumers", "consumer", "load", "hit rate", "running", "polls", "deferrals",
                       "handlers it cannot load")
    for s in client.consumer_stats():
        consumers.add_row(str(s.index), str(s.load), f"{s.hit_rate:.2f}", str(s.running),
                          str(s.polls), str(s.deferrals),
                          "; ".join(f"{t}: {e}" for t, e in s.unloadable.items()) or "-")
    fair = client.fairness()
    fairness = _table("fairness", "intervening", "victims", "offenders", "listen order")
    intervening = ("yes" if fair.intervening else "no") + (" (passive)" if fair.passive else "")
    fairness.add_row(intervening, ", ".join(sorted(fair.victims)) or "-",
                     ", ".join(sorted(fair.offenders)) or "-", ", ".join(fair.listen_order[:8]) or "-")
    flooders = _table("flooders", "queue", "type", "tenant", "spilled", "depth", "since")
    for f in client.flooders():
        flooders.add_row(f.queue, f.type, f.tenant, str(f.spilled), str(f.depth),
                         time.strftime("%H:%M:%S", time.localtime(f.since)))
    return Group(queues, shards, consumers, fairness, flooders)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=f"rayq {title}")
    for column in columns:
        table.add_column(column)
    return table


if __name__ == "__main__":
    main()
