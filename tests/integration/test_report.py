"""The Spark report through RayDP, checked figure by figure against ground truth
computed independently with pyarrow from the same synthetic event log."""

import json
import os
import random
import re
import shutil
import subprocess
from collections import defaultdict
from html.parser import HTMLParser

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

import rayq
from rayq.analytics.cells import rank_error
from rayq.analytics.eventlog import EventLog, read_events
from rayq.analytics.reference import within_rank
from actors.analytics import ANALYTICS
from rayq.analytics.report import STEPS, NoEvents, current_thresholds
from rayq.analytics.warm import run_report
from rayq.config import AnalyticsConfig, Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until
from tests.modes import exposed_under, modes_under

T0 = 1_790_000_040.0   # on a minute boundary
IDLE_STOP_S = 20.0
WINDOW_S = 60.0
TENANTS, TYPES = ("acme", "globex", "initech"), ("report", "email")


def synthetic_log(root) -> dict:
    """Ten minutes of enqueues, completions (some redelivered), deferrals, dead letters,
    fairness decisions and flood events; returns what was written, by kind."""
    rng, log, truth = random.Random(42), EventLog(root, "test"), defaultdict(list)
    for i in range(3000):
        at = T0 + i * 0.2
        tenant, type_ = rng.choice(TENANTS), rng.choice(TYPES)
        log.append("enqueue", at, tenant=tenant, type=type_, subqueue=1, message_id=f"m{i}", key=type_)
        truth["enqueue"].append((at, tenant, type_))
        outcome = "failed" if i % 37 == 0 else "succeeded"
        done = dict(tenant=tenant, type=type_, key=type_, usage_s=round(rng.uniform(0.01, 2.0), 3),
                    wait_s=round(rng.expovariate(1.0), 3), outcome=outcome,
                    attempt=2 if i % 11 == 0 else 1, message_id=f"m{i}")
        log.append("completion", at + 0.1, **done)
        truth["completion"].append((at + 0.1, done))
        if done["attempt"] > 1:
            log.append("redelivery", at + 0.1, tenant=tenant, type=type_, outcome=outcome)
        if i % 101 == 0:
            log.append("dead_letter", at + 0.1, tenant=tenant, type=type_, outcome="dead")
            log.append("deferral", at, tenant=tenant, type=type_, outcome="deferred", wait_s=0.5)
    for k, state in enumerate(["fair", "fair", "intervening", "intervening", "fair"]):
        log.append("fairness", T0 + 60 * k, outcome=state, detail=json.dumps({"k": k}))
    for k, what in enumerate(["detected", "isolated", "swept", "removed"]):
        log.append("flood", T0 + 100 + k, queue="q", type="report", tenant="acme", outcome=what,
                   detail="{}")
    log.flush()
    return truth


@pytest.fixture(scope="module")
def report(ray_session, tmp_path_factory):
    rayq.shutdown()  # Spark's executor needs a CPU the consumers of earlier modules hold
    root = tmp_path_factory.mktemp("events")
    truth = synthetic_log(str(root))
    out = tmp_path_factory.mktemp("report")
    steps = []
    result = run_report(str(root), str(out), AnalyticsConfig(window_s=WINDOW_S), steps.append,
                        current_thresholds(Config()))
    tables = {name: pq.read_table(path).to_pylist() for name, path in result.tables.items()}
    truth["written"] = read_events(str(root)).num_rows
    return result, tables, truth, steps


def succeeded(truth):
    return [d for _, d in truth["completion"] if d["outcome"] == "succeeded"]


@pytest.mark.parametrize("by", ["tenant", "type"])
def test_usage_and_wait_percentiles_per_tenant_and_type_match_pyarrow(report, by):
    _, tables, truth, _ = report
    rows = {r[by]: r for r in tables[f"usage_by_{by}"]}
    done = succeeded(truth)
    total = sum(d["usage_s"] for d in done)
    for name in (TENANTS if by == "tenant" else TYPES):
        mine = [d for d in done if d[by] == name]
        row = rows[name]
        assert row["completed"] == len(mine)
        assert row["usage_s"] == pytest.approx(sum(d["usage_s"] for d in mine))
        assert row["usage_share"] == pytest.approx(sum(d["usage_s"] for d in mine) / total)
        waits = [d["wait_s"] for d in mine]  # from sketches: within their rank error
        for q, got in zip((0.5, 0.95, 0.99), (row["wait_p50_s"], row["wait_p95_s"], row["wait_p99_s"])):
            assert within_rank(got, waits, q, rank_error())


def _windows(truth):
    usage = defaultdict(float)
    count = defaultdict(int)
    for at, d in truth["completion"]:
        if d["outcome"] == "succeeded":
            w = (at // WINDOW_S) * WINDOW_S
            usage[(w, d["type"])] += d["usage_s"]
            count[w] += 1
    return usage, count


def test_usage_share_fairness_index_and_throughput_per_window_match(report):
    _, tables, truth, _ = report
    usage, count = _windows(truth)
    shares = {(r["window_start"], r["type"]): r["usage_share"] for r in tables["usage_share_by_window"]}
    assert set(shares) == set(usage)
    for (w, t), u in usage.items():
        assert shares[(w, t)] == pytest.approx(u / sum(v for (w2, _), v in usage.items() if w2 == w))
    jain = {r["window_start"]: r["jain_index"] for r in tables["fairness_index_by_window"]}
    for w in count:
        xs = [v for (w2, _), v in usage.items() if w2 == w]
        assert jain[w] == pytest.approx(sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)))
    rates = {r["window_start"]: (r["completed"], r["per_s"]) for r in tables["throughput_by_window"]}
    assert rates == {w: (n, pytest.approx(n / WINDOW_S)) for w, n in count.items()}


def test_redeliveries_dead_letters_and_deferrals_are_counted_per_tenant_and_type(report):
    _, tables, truth, _ = report
    expected = defaultdict(lambda: defaultdict(int))
    for i, (_, d) in enumerate(truth["completion"]):
        row = expected[(d["tenant"], d["type"])]
        row["completed" if d["outcome"] == "succeeded" else "failed"] += 1
        row["redeliveries"] += i % 11 == 0
        row["dead_letters"] += i % 101 == 0
        row["deferrals"] += i % 101 == 0
    for r in tables["redeliveries"]:
        e = expected[(r["tenant"], r["type"])]
        assert [r[k] for k in ("completed", "failed", "redeliveries", "dead_letters", "deferrals")] \
            == [e[k] for k in ("completed", "failed", "redeliveries", "dead_letters", "deferrals")]
    assert len(tables["redeliveries"]) == len(expected)


def test_flood_and_intervention_timelines_keep_order_and_changes(report):
    _, tables, _, _ = report
    assert [r["event"] for r in tables["flood_timeline"]] == ["detected", "isolated", "swept", "removed"]
    assert [r["state"] for r in tables["intervention_timeline"]] == ["fair", "intervening", "fair"]


def test_suggested_thresholds_follow_the_observed_distributions(report):
    _, tables, truth, _ = report
    got = {r["name"]: r["value"] for r in tables["suggested_thresholds"]}
    waits = [d["wait_s"] for d in succeeded(truth)]
    assert within_rank(got["fairness.latency_threshold_s"] / 2, waits, 0.99, rank_error())
    per_window = defaultdict(int)
    for at, tenant, type_ in truth["enqueue"]:
        per_window[((at // 1800) * 1800, type_, tenant)] += 1
    p99 = pc.quantile(pa.array(list(per_window.values()), pa.float64()), q=0.99).to_pylist()[0]
    assert got["flood.enqueue_threshold"] == pytest.approx(2 * p99)
    level, peak = defaultdict(int), defaultdict(int)  # the backlog at each window's end
    net = defaultdict(int)
    for at, tenant, type_ in truth["enqueue"]:
        net[(type_, tenant, (at // WINDOW_S) * WINDOW_S)] += 1
    for at, d in truth["completion"]:
        if d["outcome"] == "succeeded":
            net[(d["type"], d["tenant"], (at // WINDOW_S) * WINDOW_S)] -= 1
    for type_, tenant, _ in sorted(net):
        level[(type_, tenant)] += net[(type_, tenant, _)]
        peak[(type_, tenant)] = max(peak[(type_, tenant)], level[(type_, tenant)])
    p99 = pc.quantile(pa.array(list(peak.values()), pa.float64()), q=0.99).to_pylist()[0]
    assert p99 > 0 and got["flood.depth_threshold"] == pytest.approx(2 * p99)


def test_the_report_writes_plots_and_one_self_contained_page(report):
    result, _, truth, steps = report
    assert steps[0].startswith("starting Spark") and "plotting" in steps
    assert set(result.plots) == {"usage_share", "waits", "fairness_index"}
    for path in result.plots.values():
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    page = open(result.html, encoding="utf-8").read()
    assert page.count("data:image/png;base64,") == 3 and "usage_by_tenant" in page
    assert result.events == truth["written"]


def test_a_report_with_no_events_says_so(tmp_path):
    with pytest.raises(NoEvents):
        run_report(str(tmp_path / "none"), str(tmp_path / "out"), AnalyticsConfig())


def test_client_reports_count_real_tasks_find_spark_warm_and_start_it_anew_once_it_idled(
        report, tmp_path_factory):
    from actors import analytics

    # Spark stays warm for IDLE_STOP_S after a report: far longer than the few tasks run
    # between the first two reports take, even on a loaded machine
    config = Config(consumers=ConsumerConfig(count=1, poll_wait_s=0.3),
                    analytics=AnalyticsConfig(flush_interval_s=3600,  # only report() flushes
                                              idle_stop_s=IDLE_STOP_S))
    client, data_dir = start_runtime(tmp_path_factory, config, name="report-runtime")

    @rayq.task(type="double")
    def double(x):
        return 2 * x

    def complete(tenants: list[str]) -> None:
        refs = [client.submit(double, i, tenant=tenant) for i, tenant in enumerate(tenants)]
        assert ray.get(refs, timeout=60) == [2 * i for i in range(len(tenants))]

    def run(tenants: list[str]):
        complete(tenants)
        steps = []
        result = client.report(tmp_path_factory.mktemp("client-report"), progress=steps.append)
        rows = pq.read_table(result.tables["usage_by_tenant"]).to_pylist()
        return result, steps, {r["tenant"]: r["completed"] for r in rows}

    first_tenants = ["a" if i % 3 else "b" for i in range(30)]
    complete(first_tenants[:1])  # a task ran: the consumer holds its CPU
    cpus = ray.available_resources().get("CPU", 0)  # what Spark's executor will give back
    first, first_steps, rows = run(first_tenants[1:])
    assert rows == {"a": 20, "b": 10}
    kinds = read_events(os.path.join(data_dir, "events")).column("kind").to_pylist()
    assert kinds.count("enqueue") == 30 and kinds.count("completion") == 30
    # a second report finds Spark warm and adds only the new events
    second, steps, rows = run(["c"] * 8)
    assert first_steps[0].startswith("starting Spark") and steps[0] == "Spark is warm"
    assert len(steps) == len(first_steps) == STEPS
    assert rows == {"a": 20, "b": 10, "c": 8}
    assert second.events == read_events(os.path.join(data_dir, "events")).num_rows > first.events
    stats = analytics.stats()
    assert stats.spark and stats.reports == 2 and stats.events == second.events
    # Spark ran inside the runtime and logged under <data_dir>/spark: its owner's alone too
    assert "spark/spark.log" in modes_under(data_dir) and exposed_under(data_dir) == {}
    # idle that long, the analytics actor gives Spark's executor back and exits; the next
    # report starts Spark anew in a new one (RayDP starts Spark once per process)
    wait_until(lambda: ANALYTICS not in ray.util.list_named_actors(), timeout_s=120,
               what="the idle analytics actor to exit")
    wait_until(lambda: ray.available_resources().get("CPU", 0) >= cpus, timeout_s=60,
               what="Spark's executor CPU back")
    with pytest.raises(rayq.RuntimeFailure):
        analytics.stats()
    third, steps, rows = run(["d"])
    assert steps[0].startswith("starting Spark") and rows == {"a": 20, "b": 10, "c": 8, "d": 1}
    assert third.events > second.events
    rayq.shutdown()
    wait_until(lambda: ANALYTICS not in ray.util.list_named_actors(), what="analytics actor gone")


# -- the page as a person sees it: rendered by headless Chromium ---------------------------
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(page: str, profile, *flags: str) -> str:
    """Run Debian's headless Chromium on ``page`` with a fresh profile; returns stdout."""
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed (make test installs it: apt-get install chromium)"
    done = subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags,
                           f"file://{page}"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Page(HTMLParser):
    """The rendered DOM: headline rows, table cells by header, image sources, text."""

    def __init__(self, dom: str):
        super().__init__()
        self.text, self.images, self.headline, self.tables = [], [], {}, []
        self._cell, self._row, self._in_headline = None, [], False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._in_headline = "headline" in (attrs.get("class") or "")
            self.tables.append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self.tables:
            if self._in_headline and len(self._row) == 2:
                self.headline[self._row[0]] = self._row[1]
            self.tables[-1].append(self._row)

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def column(self, header_prefix: str) -> list[str]:
        """Every cell under a header starting with ``header_prefix``, in every table."""
        out = []
        for rows in self.tables:
            if rows and any(h.startswith(header_prefix) for h in rows[0]):
                i = next(i for i, h in enumerate(rows[0]) if h.startswith(header_prefix))
                out += [r[i] for r in rows[1:] if len(r) > i]
        return out


LOCAL_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def test_the_page_rendered_in_chromium_answers_what_happened_first(report, tmp_path):
    result, tables, truth, _ = report
    dom = Page(chromium(result.html, tmp_path / "profile", "--dump-dom"))
    text = " ".join(dom.text)
    assert "e+09" not in text and "e+0" not in text  # no epoch seconds in scientific notation
    head = dom.headline
    succeeded = len([d for _, d in truth["completion"] if d["outcome"] == "succeeded"])
    assert head["Tasks"].startswith(f"{succeeded:,} completed")
    assert head["Tenants"] == "3: acme, globex, initech" and head["Job types"] == "2: email, report"
    worst = max((d for _, d in truth["completion"] if d["outcome"] == "succeeded"),
                key=lambda d: d["wait_s"])
    assert f"tenant {worst['tenant']}, type {worst['type']}" in head["Worst wait"]
    assert head["Interventions"].startswith("1, 2 min 0 s")      # 2 of the 5 decisions
    assert head["Floods"].startswith("1,") and "report/acme" in head["Floods"]
    assert "10 min 0 s" in head["Time span"]
    times = dom.column("time (") + dom.column("window start (")
    assert times and all(LOCAL_TIME.match(t) for t in times), times[:5]
    current = dom.column("current")
    assert current[:1] == [f"{Config().fairness.latency_threshold_s:,.2f}"]
    tenants = [r for r in dom.tables if r and r[0][:2] == ["tenant", "completed"]][0][1:]
    usage = [float(r[2].replace(",", "")) for r in tenants]
    assert usage == sorted(usage, reverse=True)                  # busiest tenant first
    assert len(dom.images) == 3 and all(src.startswith("data:image/png;base64,") for src in dom.images)


def test_the_page_screenshot_is_a_real_picture(report, tmp_path):
    import matplotlib.image

    result, _, _, _ = report
    shot = tmp_path / "page.png"
    chromium(result.html, tmp_path / "profile", "--window-size=1200,1600", f"--screenshot={shot}")
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (1600, 1200)
    assert pixels.std() > 0.05  # text, plots and tables, not a blank page
