"""``rayq report``: Spark on the running Ray cluster (RayDP) reads the event log and
writes Parquet tables, PNG plots and one self-contained HTML page. The runtime's
reports run in its analytics actor (actors/analytics.py), whose Spark stays warm
between reports (rayq.analytics.warm); :func:`rayq.analytics.warm.run_report` runs one in this process.

Results leave Spark as Parquet files (small tables are read back with pyarrow), not
through ``ray.data.from_spark``, which crashed on Ray 2.53 and 2.60 with raydp
1.6.5 ("Check failed: objects_valid").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from rayq.analytics.schema import TABLES
from rayq.config import AnalyticsConfig, Config
from rayq.core.kit.private import make_private_dir, make_private_file
from rayq.errors import NoEvents  # noqa: F401  (re-exported here too)

# progress() calls of a report: start Spark (or find it warm), one per table, plot,
# write the page.
STEPS = len(TABLES) + 3


@dataclass(frozen=True)
class Report:
    """What ``client.report`` made: the HTML page, Parquet tables and PNG plots by name."""

    html: str
    tables: dict[str, str]
    plots: dict[str, str] = field(default_factory=dict)
    events: int = 0
    seconds: float = 0.0


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
    configs = {"spark.pyspark.python": sys.executable,  # this interpreter and its packages
               "spark.pyspark.driver.python": sys.executable,
               "spark.driver.memory": config.driver_memory,
               "spark.driver.host": host, "spark.driver.bindAddress": host,
               "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
               "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
               # The report's queries are small aggregates: re-planning each stage at run
               # time (adaptive execution) costs more than it saves (benchmarks/report.py).
               "spark.sql.adaptive.enabled": "false",
               "spark.ui.showConsoleProgress": "false"}
    if log_config:
        configs["spark.log4j.config.file.name"] = log_config  # RayDP's -Dlog4j2.configurationFile
    return raydp.init_spark(
        app_name="rayq-report", num_executors=config.executors,
        executor_cores=config.executor_cores, executor_memory=config.executor_memory,
        configs=configs)
