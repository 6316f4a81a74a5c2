"""Frozen configuration values.

Every threshold has the default its mechanism's page in docs/ gives. Nothing here
reads the environment at import: :func:`load` is called once, by the CLI or at
runtime start-up.
"""

from __future__ import annotations

import dataclasses
import os
import re
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from rayq.errors import ConfigError

DAY_S = 24 * 3600
MAX_BODY_BYTES = 1 << 30  # no limit on a body or a result can be set higher (the decoders' own)
MAX_CONSUMERS = 1000  # consumer actors of a kind (regular, boosters) a runtime runs at most
MAX_SHARDS = 256  # the highest store.max_shards: shards scaling may add at most


def _is_count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= MAX_CONSUMERS


@dataclass(frozen=True)
class StoreConfig:
    """Shard storage and the memory-pressure-aware cache."""

    shards: int = 2
    cache_budget_bytes: int = 64 << 20
    max_message_bytes: int = 16 << 20
    # A task's body (its arguments) and its result may be larger than a queue message
    # (docs/tasks.md#values); stored in blob chunks as every large body is.
    max_task_bytes: int = 256 << 20
    blob_threshold_bytes: int = 64 << 10
    blob_chunk_bytes: int = 1 << 20
    initial_map_bytes: int = 256 << 20
    # Pressure also when the shard process grows past this RSS (None: no limit) ...
    process_memory_limit_bytes: int | None = None
    # ... or when the machine has less than this available.
    min_available_bytes: int = 256 << 20
    pressure_check_interval_s: float = 0.25
    default_visibility_timeout_s: float = 30.0
    max_visibility_timeout_s: float = 12 * 3600.0
    default_ttl_s: float = 7 * DAY_S
    max_ttl_s: float = 7 * DAY_S
    max_delay_s: float = 7 * DAY_S
    # Upper bound on rows one receive may step over (expired / dead-lettered).
    max_scan_rows: int = 1000
    outcome_ttl_s: float = DAY_S   # how long a task's outcome is kept for ray.get
    # The store's enqueue count windows: a shard builds them from the flood look-back
    # (shard_store_config: [flood] window_s and windows), not settings of their own.
    enqueue_window_s: float = 180.0
    enqueue_windows: int = 10
    durable: bool = True
    # clients and consumers on a shard's host send put/receive/delete/... over a Unix
    # socket (rayq.channel: ~0.05 ms a round trip beside ~0.9 ms for a Ray call)
    local_channel: bool = True
    # ... and those on other hosts over TCP to the shard's node address, every frame
    # keyed with a key the shard hands out through Ray (rayq.core.codec.keyed); off:
    # Ray actor calls. Needs local_channel.
    remote_channel: bool = True
    # The custom Ray resource that marks data nodes (docs/replication.md): shards spread
    # over the alive nodes holding it, each pinned to its node, files under
    # <data_dir>/<the node's rayq-data-node label>/. No node with it (the embedded
    # runtime on one machine): this node alone, files directly in data_dir.
    data_resource: str | None = "rayq_data"
    # Copies of each shard on distinct data nodes, the leader's included (None: one per
    # node up to two: rayq.core.control.placement.default_replicas). A write is
    # acknowledged once every in-sync copy committed it (docs/replication.md).
    replicas: int | None = None
    # Fewest in-sync copies (the leader's included) a write needs to be acknowledged,
    # like Kafka's min.insync.replicas; fewer: writes fail with NotEnoughReplicas.
    min_in_sync: int = 1
    # Scaling adds a shard (a writer, led from the data node leading fewest) when a busy
    # queue has a subqueue on every shard, while fewer than this many run
    # (docs/autoscaling.md); at or below ``shards`` (0 too) no shard is ever added.
    max_shards: int = 8


INTERVENTION_MODES = frozenset({"active", "passive"})


@dataclass(frozen=True)
class FairnessConfig:
    """The fairness coordinator (docs/fairness-coordinator.md) and fair dispatch."""

    enabled: bool = True
    key: str = "type"  # "type", "tenant" or "tenant_type"
    window_s: float = 300.0
    windows: int = 6
    latency_threshold_s: float = 1200.0
    # A key's latency: "enqueue", the age of its oldest visible message since it was
    # enqueued (the source text's), or "visible", since it became visible (a delay or
    # a retry's back-off is not waiting for threads).
    latency_since: str = "enqueue"
    band: float = 0.5
    # Keep an intervention on, once started, while a latency victim is below its fair
    # share at all (False: only while some key is both a latency and a usage victim,
    # the source text's rule).
    intervention_hysteresis: bool = False
    # "active": an intervention reorders consumers' listen lists and starts boosters;
    # "passive": decisions are evaluated and recorded, marked passive, and change
    # nothing (the source text's "passive merely logging"). Admins switch it at run
    # time with client.set_intervention (docs/fairness-coordinator.md).
    intervention: str = "active"
    # Nodes where intervention is off (Ray node id, IP address or rayq-data-node
    # label): consumers there ignore the plan's order (the text's "per ... node").
    intervention_off_nodes: tuple[str, ...] = field(default=(), hash=False)
    interval_s: float = 300.0
    max_boost_consumers: int = 2   # consumers added at most for booster permits
    history: int = 1000            # decisions kept for client.fairness() and the event log
    # Shard-local fair dispatch, the first layer (SQS fair queues' rule, see
    # rayq.core.storage.dispatch): "fair", or "fifo" for oldest-first across keys.
    dispatch: str = "fair"
    # Thread-time entitlement per fairness key (both layers): a key of weight 2 is
    # entitled to twice the handler time of a key of weight 1.
    weights: Mapping[str, float] = field(default_factory=dict, hash=False)
    default_weight: float = 1.0
    noisy_share: float = 0.1          # a key over this share of in-flight or recent time is noisy
                                      # (1: none is, leaving the shares to the weights alone)
    noisy_min_inflight: int = 30      # ... the in-flight rule needs at least this many
    noisy_idle_s: float = 300.0       # a noisy key that sent nothing this long is quiet again
    usage_half_life_s: float = 30.0   # "recent" processing time forgets at this half-life


@dataclass(frozen=True)
class FloodConfig:
    """Flood detection, spill and sweep (docs/flood-detection.md)."""

    enabled: bool = True
    # The look-back of enqueue counts, window_s x windows (30 minutes): shards count
    # each (queue, type, tenant)'s enqueues in these windows.
    window_s: float = 180.0
    windows: int = 10
    interval_s: float = 120.0
    depth_threshold: int = 100_000
    enqueue_threshold: int = 10_000
    type_depth_threshold: int = 200_000
    sweep_batch: int = 100
    healthy_depth: int = 50_000
    exit_dedicated: int = 5_000
    exit_shared: int = 50_000
    # Every n-th receive on a shard that holds a flooder's dedicated subqueue behind
    # live ones serves the dedicated one first (docs/flood-detection.md): the source
    # text's dedicated queue is one more broker queue, served in turn with the rest.
    dedicated_turn_every: int = 2
    # What happens to a listed flooder's new messages (docs/flood-detection.md, the
    # source text's "throttle or block new incoming messages"): "spill" stores them in
    # the spill store for the sweeper; "throttle" spills up to flooder_rate_per_s
    # (a bucket of flooder_burst messages) per flooder and shard, and refuses puts past
    # it with Throttled; "block" refuses every put of a flooder with Throttled while
    # it is listed. A refused put stores nothing.
    flooder_puts: str = "spill"
    flooder_rate_per_s: float = 100.0
    flooder_burst: int = 1000


@dataclass(frozen=True)
class ConsumerConfig:
    """Hit-rate self-balancing consumers (docs/consumer-balancing.md), and how many run
    (docs/autoscaling.md#consumers-follow-the-backlog).

    With ``min_count`` and ``max_count`` both None the runtime runs ``count`` consumer
    actors, fixed. Setting either makes the count follow the task backlog between
    the two (``--autoscale=max,min`` in Celery, a KEDA ScaledObject's replica counts);
    the bound left None is ``count``, moved to stay on its side of the other
    (``min_count=0`` alone: 0 to ``count``; ``min_count=5`` alone: 5 to 5).
    """

    count: int = 2                     # consumer actors when fixed; the bound left unset
    min_count: int | None = None       # fewest consumer actors (0: none while no task waits)
    max_count: int | None = None       # most consumer actors, however long the backlog
    scale_down_idle_s: float = 60.0    # the backlog empty this long: down to min_count
    min_load: int = 1
    max_load: int = 8
    min_target: float = 0.2
    max_target: float = 0.9
    smoothing: float = 0.3             # weight of the newest hit rate in the moving average
    adjust_interval_s: float = 1.0     # how often a consumer moves its load
    poll_wait_s: float = 2.0           # long-poll wait of one receive
    # A receive is a hit for the balancer only when it found tasks within this wait:
    # the source's reads do not block, so a long poll answered later would have missed.
    hit_wait_s: float = 0.05
    prefetch: int = 1                  # at least this many a receive; more when the load has room
    visibility_timeout_s: float = 30.0  # tasks hidden while running; extended by heartbeats
    retry_backoff_s: float = 1.0       # first retry delay after a handler raised; doubles
    max_backoff_s: float = 60.0
    defer_s: float = 0.5               # how long a message of a saturated type stays hidden
    unrunnable_after_s: float = 600.0  # a task no handler was registered for this long after
                                       # it was sent is dead-lettered, not put back again
    num_cpus: float = 0.5              # Ray CPUs reserved per consumer actor
    max_host_memory_percent: float = 95.0  # a consumer whose host is over this backs off
    max_host_cpu_percent: float = 100.0    # the same for CPU (100: never)

    def __post_init__(self) -> None:
        for name in ("count", "min_count", "max_count"):
            value = getattr(self, name)
            if value is not None and not _is_count(value):
                raise ConfigError(f"consumers.{name} must be an int within "
                                  f"[0, {MAX_CONSUMERS}], got {value!r}")
        if None not in (self.min_count, self.max_count) and self.min_count > self.max_count:
            raise ConfigError("consumers need min_count <= max_count, got "
                              f"{self.min_count} > {self.max_count}")
        if not self.scale_down_idle_s >= 0:
            raise ConfigError("consumers.scale_down_idle_s must be at least 0")

    @property
    def autoscaled(self) -> bool:
        """Whether the count follows the task backlog (a bound is set) or is fixed."""
        return self.min_count is not None or self.max_count is not None

    @property
    def bounds(self) -> tuple[int, int]:
        """(fewest, most) consumer actors: ``count`` stands in for a bound left None,
        kept on its side of the other one; (``count``, ``count``) when fixed."""
        high = self.max_count if self.max_count is not None else max(self.count,
                                                                     self.min_count or 0)
        low = self.min_count if self.min_count is not None else min(self.count, high)
        return low, high


@dataclass(frozen=True)
class ScalingConfig:
    """Subqueue scale-up and scale-down (docs/autoscaling.md); evaluated every ``interval_s``."""

    interval_s: float = 1.0
    # a subqueue's operations are requests (a put, a receive; a batch is one), and this
    # many a second make it busy; the text's example is 1 000: docs/autoscaling.md says why not
    scale_up_ops_per_s: float = 5_000.0
    scale_up_throttled_per_s: float = 1.0
    idle_ops_per_s: float = 1.0       # a subqueue this slow is quiet whatever it holds
    idle_s: float = 60.0              # how long a subqueue stays quiet before one retires
    max_subqueues: int = 8
    small_count: int = 1_000          # a subqueue holding fewer messages is small
    fast_ops_fraction: float = 0.25   # under this share of scale_up_ops_per_s it serves fast
    seldom_throttled_per_s: float = 0.1  # throttling under this rate is seldom


@dataclass(frozen=True)
class AnalyticsConfig:
    """The event log and the Spark report (RayDP), sized for a 2-core machine by default."""

    events: bool = True              # write the Parquet event log under <data_dir>/events
    flush_interval_s: float = 2.0    # how often writers turn buffered events into files
    window_s: float = 60.0           # the report's time windows
    executors: int = 1
    executor_cores: int = 1
    executor_memory: str = "700M"
    driver_memory: str = "700m"
    shuffle_partitions: int = 4
    # The analytics actor keeps Spark warm between reports; after this long without one
    # it stops Spark and exits, so an idle runtime holds no JVM (0: never).
    idle_stop_s: float = 600.0
    # Where every writer puts its events and the report reads them: a pyarrow file system
    # URI (a shared folder "file:///mnt/shared/rayq-events", "s3://bucket/rayq-events").
    # None: each node keeps its own under <data_dir>/<node>/events, read on that node.
    events_uri: str | None = None


@dataclass(frozen=True)
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    flood: FloodConfig = field(default_factory=FloodConfig)
    consumers: ConsumerConfig = field(default_factory=ConsumerConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig)
    # The runtime's name: runtimes of other names on the same Ray cluster (staging beside
    # production) never see each other's actors, queues or records. Letters, digits,
    # '_', '-', '.'; its data lives in a folder of its own by default.
    name: str = "rayq"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RUNTIME_NAME.fullmatch(self.name):
            raise ConfigError("name must be 1 to 64 letters, digits, '_', '-' or '.', "
                              f"got {self.name!r}")
        if self.fairness.key not in FAIRNESS_KEYS:
            raise ConfigError(f"fairness.key must be one of {sorted(FAIRNESS_KEYS)}")
        shards = self.store.shards
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ConfigError(f"store.shards must be an int of at least 1, got {shards!r}")
        if not 1 <= self.consumers.min_load <= self.consumers.max_load:
            raise ConfigError("consumers need 1 <= min_load <= max_load")
        if not self.consumers.hit_wait_s >= 0:
            raise ConfigError("consumers.hit_wait_s must be at least 0")
        _check_fair_dispatch(self.fairness)
        _check_replicas(self.store)
        _check_max_shards(self.store)
        _check_flood_window(self.flood, self.store)
        _check_body_limits(self.store)
        _check_events_uri(self.analytics)


def _check_events_uri(analytics: "AnalyticsConfig") -> None:
    uri = analytics.events_uri
    if uri is not None and not (isinstance(uri, str) and _EVENTS_URI.fullmatch(uri)):
        raise ConfigError("analytics.events_uri must be a URI of one of pyarrow's file systems "
                          f"({', '.join(_EVENTS_SCHEMES)}), such as 'file:///shared/rayq-events' "
                          f"or 's3://bucket/rayq-events', got {uri!r:.200}")


# Checked here, once: a writer that met a scheme pyarrow cannot open would fail on
# its hot path (an append that flushes inline).
_EVENTS_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
_EVENTS_URI = re.compile(rf"(?:{'|'.join(_EVENTS_SCHEMES)})://\S+")


FLOODER_PUTS = frozenset({"spill", "throttle", "block"})


def _check_flood_window(flood: "FloodConfig", store: "StoreConfig") -> None:
    if flood.flooder_puts not in FLOODER_PUTS:
        raise ConfigError(f"flood.flooder_puts must be one of {sorted(FLOODER_PUTS)}")
    if isinstance(flood.flooder_burst, bool) or not isinstance(flood.flooder_burst, int) \
            or flood.flooder_burst < 1 or not flood.flooder_rate_per_s > 0:
        raise ConfigError("flood needs flooder_rate_per_s > 0 and flooder_burst an int >= 1")
    if flood.window_s <= 0 or isinstance(flood.windows, bool) or not isinstance(
            flood.windows, int) or flood.windows < 1:
        raise ConfigError("flood needs window_s > 0 and windows an int of at least 1")
    default = StoreConfig()
    if (store.enqueue_window_s, store.enqueue_windows) != (default.enqueue_window_s,
                                                           default.enqueue_windows):
        raise ConfigError("the enqueue look-back is set by flood.window_s and flood.windows, "
                          "not store.enqueue_window_s and store.enqueue_windows")


def _check_body_limits(store: "StoreConfig") -> None:
    for name in ("max_message_bytes", "max_task_bytes"):
        value = getattr(store, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BODY_BYTES:
            raise ConfigError(f"store.{name} must be an int from 1 to {MAX_BODY_BYTES}, "
                              f"got {value!r}")


def shard_store_config(config: "Config") -> StoreConfig:
    """The store settings a shard runs with: enqueues counted over the flood
    look-back (``flood.window_s`` x ``flood.windows``, the one setting of it)."""
    return dataclasses.replace(config.store, enqueue_window_s=config.flood.window_s,
                               enqueue_windows=config.flood.windows)


def _check_replicas(store: "StoreConfig") -> None:
    def whole(value) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= 3
    if store.replicas is not None and not whole(store.replicas):
        raise ConfigError(f"store.replicas must be None, 1, 2 or 3, got {store.replicas!r}")
    if not whole(store.min_in_sync):
        raise ConfigError(f"store.min_in_sync must be 1, 2 or 3, got {store.min_in_sync!r}")


def _check_max_shards(store: "StoreConfig") -> None:
    bound = store.max_shards
    if isinstance(bound, bool) or not isinstance(bound, int) or not 0 <= bound <= MAX_SHARDS:
        raise ConfigError(f"store.max_shards must be an int from 0 to {MAX_SHARDS}, got {bound!r}")


def _check_fair_dispatch(fairness: "FairnessConfig") -> None:
    if fairness.dispatch not in ("fair", "fifo"):
        raise ConfigError("fairness.dispatch must be 'fair' or 'fifo'")
    if fairness.intervention not in INTERVENTION_MODES:
        raise ConfigError(f"fairness.intervention must be one of {sorted(INTERVENTION_MODES)}")
    if isinstance(fairness.intervention_off_nodes, str) or not all(
            isinstance(n, str) and n for n in fairness.intervention_off_nodes):
        raise ConfigError("fairness.intervention_off_nodes must be a list of node names")
    if fairness.latency_since not in ("enqueue", "visible"):
        raise ConfigError("fairness.latency_since must be 'enqueue' or 'visible'")
    weights = dict(fairness.weights, **{"(default_weight)": fairness.default_weight})
    for key, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < 1e6:
            raise ConfigError(f"fairness weight of {key!r} must be a number in (0, 1e6)")
    if not 0 < fairness.noisy_share <= 1 or fairness.usage_half_life_s <= 0:
        raise ConfigError("fairness needs 0 < noisy_share <= 1 and usage_half_life_s > 0")


FAIRNESS_KEYS = frozenset({"type", "tenant", "tenant_type"})
_RUNTIME_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SECTIONS = {"store": StoreConfig, "fairness": FairnessConfig, "flood": FloodConfig,
             "consumers": ConsumerConfig, "scaling": ScalingConfig,
             "analytics": AnalyticsConfig}


def from_dict(data: dict[str, Any]) -> Config:
    """Build a :class:`Config` from nested mappings (e.g. a parsed TOML file; the runtime's
    ``name`` at the top)."""
    sections: dict[str, Any] = {}
    for name, values in data.items():
        if name == "name":
            sections["name"] = values
            continue
        cls = _SECTIONS.get(name)
        if cls is None or not isinstance(values, dict):
            raise ConfigError(f"unknown configuration section {name!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"unknown settings in [{name}]: {sorted(unknown)}")
        sections[name] = cls(**values)
    return Config(**sections)


def load(path: str | os.PathLike | None = None, env: dict[str, str] | None = None) -> Config:
    """Read a TOML file (``path`` or ``$RAYQ_CONFIG``) once; defaults when neither is set.
    ``$RAYQ_NAME`` names the runtime over the file's ``name``. Raises ConfigError when the
    file is not valid TOML or holds unknown settings."""
    env = os.environ if env is None else env
    config = _load_file(path or env.get("RAYQ_CONFIG"))
    if env.get("RAYQ_NAME"):
        config = dataclasses.replace(config, name=env["RAYQ_NAME"])
    return config


def _load_file(path: str | os.PathLike | None) -> Config:
    if not path:
        return Config()
    with open(Path(path), "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from err
    return from_dict(data)


def with_consumers(config: Config, count: int) -> Config:
    """The same configuration with ``count`` consumer actors."""
    return dataclasses.replace(config, consumers=dataclasses.replace(config.consumers, count=count))
