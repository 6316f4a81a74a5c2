"""The flood look-back (docs/flood-detection.md): a shard counts enqueues over
``FloodConfig.window_s`` x ``windows``, the one setting of it, so a tenant whose
burst is older than the look-back is no flooder. On a fake clock, through a shard's
store (in memory) and the detector's rules."""

import pytest

from rayq.config import Config, FloodConfig, StoreConfig, shard_store_config
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.flood.detection import build_view, detect
from rayq.errors import ConfigError
from rayq.testing import FakeClock, memory_store
from rayq.core.storage.writes import Put
from tests.contract.helpers import batch

FLOOD = FloodConfig(window_s=1.0, windows=5, depth_threshold=300, enqueue_threshold=50,
                    type_depth_threshold=10_000)


def burst(store, tenant: str, n: int) -> None:
    store.run(Put(0, batch(*[NewMessage(encode_body(i, 1 << 20), tenant, "job", tenant)
                             for i in range(n)])))


def flagged_after(gap_s: float, flood: FloodConfig = FLOOD) -> set[str]:
    """A sends 100, ``gap_s`` later B sends 250 (all still queued); who is flagged."""
    clock = FakeClock(start=1_000.0)
    store = memory_store(shard_store_config(Config(flood=flood)), clock=clock)
    burst(store, "A", 100)
    clock.advance(gap_s)
    burst(store, "B", 250)
    view = build_view({0: ("q", False)}, [store.tenant_counts()], [store.enqueue_counts()])
    return {f.tenant for f in detect(view, [], flood, clock.now()).added}


@pytest.mark.parametrize("gap_s, flagged", [
    (0.0, {"A", "B"}),
    (4.0, {"A", "B"}),     # A's window is the oldest of the five still counted
    (5.0, {"B"}),          # A's window has left the 5 s look-back
    (10.0, {"B"}),         # the example: 1 s x 5, B 10 s after A
])
def test_a_burst_older_than_the_look_back_ages_out(gap_s, flagged):
    assert flagged_after(gap_s) == flagged


def test_the_default_look_back_is_thirty_minutes_of_three_minute_windows():
    store = shard_store_config(Config())
    assert (store.enqueue_window_s, store.enqueue_windows) == (180.0, 10)
    assert flagged_after(27 * 60.0, FloodConfig(depth_threshold=300, enqueue_threshold=50)) \
        == {"A", "B"}  # windows are aligned: 27 minutes on, A's is the oldest one kept


@pytest.mark.parametrize("config", [
    dict(store=StoreConfig(enqueue_window_s=60.0)),
    dict(store=StoreConfig(enqueue_windows=3)),
    dict(flood=FloodConfig(window_s=0.0)),
    dict(flood=FloodConfig(windows=0)),
])
def test_the_look_back_is_set_once_and_must_make_sense(config):
    with pytest.raises(ConfigError):
        Config(**config)
