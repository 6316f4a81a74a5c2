"""``rayq report``: Spark on the running Ray cluster (RayDP) reads the event log and
writes Parquet tables, PNG plots and one self-contained HTML page. The runtime's
reports run in its analytics actor (actors/analytics.py), whose Spark stays warm
between reports (rayq.analytics.warm); :func:`rayq.analytics.warm.run_report` runs one in this process.

The events' aggregates (rayq.analytics.cells, made where the events lie) enter Spark
from Arrow tables in Ray's object store (RayDP's ``ray_dataset_to_spark_dataframe``,
see rayq.analytics.warm). Results leave Spark as
Arrow collected by the driver, not through ``ray.data.from_spark``, which crashed on
Ray 2.53 and 2.60 with raydp 1.6.5 ("Check failed: objects_valid"). The analytics
actor writes the page and tables into a folder of its own and sends their bytes back
(:class:`ReportFiles`): ``client.report`` writes them on the caller's machine.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field

from rayq.analytics.schema import TABLES
from rayq.config import AnalyticsConfig, Config
from rayq.core.kit.private import FILE_MODE, make_private_dir, make_private_file
from rayq.errors import NoEvents  # noqa: F401  (re-exported here too)

# progress() calls of a report: start Spark (or find it warm), merge the new events
# (none when there are none), one per table, plot, write the page.
STEPS = len(TABLES) + 4


@dataclass(frozen=True)
class Report:
    """What ``client.report`` made: the HTML page, Parquet tables and PNG plots by name."""

    html: str
    tables: dict[str, str]
    plots: dict[str, str] = field(default_factory=dict)
    events: int = 0
    seconds: float = 0.0
    # Where this report's new events were read: one EventRead per source (a data
    # node, or the events URI), with the Ray node the read ran on.
    reads: tuple = ()


@dataclass(frozen=True)
class ReportFiles:
    """A report made in another process, perhaps on another node: ``report`` with its
    paths relative to the folder it was made in, and ``files``, each file's bytes by
    that relative path (Parquet aggregates, PNG plots, one HTML page: small)."""

    report: Report
    files: dict[str, bytes]

    def write(self, out_dir: str | os.PathLike) -> Report:
        """Write the files under ``out_dir`` (each replaced whole, the owner's alone: they
        name tenants) and return the report with its paths there."""
        out_dir = os.path.abspath(out_dir)
        for name, data in self.files.items():
            path = os.path.join(out_dir, *name.split("/"))
            make_private_dir(os.path.dirname(path))
            tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        return _moved(self.report, lambda rel: os.path.join(out_dir, *rel.split("/")))


def pack(report: Report, out_dir: str) -> ReportFiles:
    """The report made under ``out_dir`` and every file there, by relative path."""
    files = {}
    for folder, _, names in os.walk(out_dir):
        for name in names:
            if not name.startswith("."):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, out_dir).replace(os.sep, "/")] = f.read()
    return ReportFiles(_moved(report, lambda path: os.path.relpath(path, out_dir).replace(
        os.sep, "/")), files)


def _moved(report: Report, where) -> Report:
    return dataclasses.replace(report, html=where(report.html),
                               tables={k: where(v) for k, v in report.tables.items()},
                               plots={k: where(v) for k, v in report.plots.items()})


def current_thresholds(config: Config) -> dict[str, float]:
    """The thresholds in force, named as ``suggested_thresholds`` names them."""
    return {"fairness.latency_threshold_s": config.fairness.latency_threshold_s,
            "flood.enqueue_threshold": config.flood.enqueue_threshold,
            "flood.depth_threshold": config.flood.depth_threshold}


# Spark's driver logs WARN and up to <out_dir>/spark.log and only errors to the console
# (its start-up chatter and stage progress bars would bury the report's own progress).
LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.console.ref = console
"""


def spark_log_config(out_dir: str) -> tuple[str, str]:
    """(log4j2 configuration file, Spark's log file), both under ``out_dir``."""
    make_private_dir(out_dir)  # Spark's log may quote messages: the owner's alone
    log, conf = os.path.join(out_dir, "spark.log"), os.path.join(out_dir, "spark-log4j2.properties")
    make_private_file(log)  # log4j appends to it and keeps its mode
    with open(make_private_file(conf), "w", encoding="utf-8") as f:
        f.write(LOG4J2.format(log=log))
    return conf, log


def spark_session(config: AnalyticsConfig, log_config: str | None = None):
    """Spark on the running Ray cluster (RayDP), sized by ``config``. Its driver binds
    where this process's Ray node does: 127.0.0.1 on the embedded default."""
    import ray
    import raydp

    host = ray.util.get_node_ip_address()
    os.environ["SPARK_LOCAL_IP"] = host  # read by the Spark driver's JVM, started next
    # The executors' Python workers (RayDP's conversion from Arrow runs in them) take
    # this interpreter from the environment; spark.pyspark.python alone does not reach them.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    configs = {"spark.pyspark.python": sys.executable,  # this interpreter and its packages
               "spark.pyspark.driver.python": sys.executable,
               "spark.driver.memory": config.driver_memory,
               "spark.driver.host": host, "spark.driver.bindAddress": host,
               "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
               "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
               # The report's queries are small aggregates: re-planning each stage at run
               # time (adaptive execution) costs more than it saves (benchmarks/report.py).
               "spark.sql.adaptive.enabled": "false",
               # Spark works on aggregates (cells), not raw events: compiling each query
               # to code costs more than it saves on them.
               "spark.sql.codegen.wholeStage": "false",
               # The JVMs run many small jobs for a short while: the quick JIT compiler
               # alone (C1) warms up sooner than C1 then C2 (a warm report at a million
               # events: 2.8 s instead of 4.6 s; the first, 15 s instead of 20 s).
               "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
               "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
               "spark.ui.showConsoleProgress": "false"}
    if log_config:
        configs["spark.log4j.config.file.name"] = log_config  # RayDP's -Dlog4j2.configurationFile
    return raydp.init_spark(
        app_name="rayq-report", num_executors=config.executors,
        executor_cores=config.executor_cores, executor_memory=config.executor_memory,
        configs=configs)
