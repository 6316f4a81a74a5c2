"""Concurrency leases: a limited type never has more than `limit` live leases."""

from rayq.core.fairness.leases import ConcurrencyLeases


def test_a_type_at_its_limit_refuses_more_leases_until_one_is_released():
    leases = ConcurrencyLeases()
    assert leases.acquire("pdf", "a", limit=2, ttl_s=10, now=0)
    assert leases.acquire("pdf", "b", limit=2, ttl_s=10, now=0)
    assert not leases.acquire("pdf", "c", limit=2, ttl_s=10, now=1)
    assert leases.acquire("csv", "c", limit=2, ttl_s=10, now=1)  # other types are independent
    leases.release("pdf", "a")
    assert leases.acquire("pdf", "c", limit=2, ttl_s=10, now=2)
    assert leases.stats(now=2).refused == {"pdf": 1}


def test_a_lease_of_a_dead_holder_expires_and_frees_its_slot():
    leases = ConcurrencyLeases()
    assert leases.acquire("pdf", "dead", limit=1, ttl_s=5, now=0)
    assert not leases.acquire("pdf", "alive", limit=1, ttl_s=5, now=4.9)
    assert leases.acquire("pdf", "alive", limit=1, ttl_s=5, now=5.0)
    assert leases.held("pdf", now=5.0) == 1


def test_renewal_keeps_a_lease_alive_and_fails_once_it_lapsed():
    leases = ConcurrencyLeases()
    leases.acquire("pdf", "a", limit=1, ttl_s=5, now=0)
    assert leases.renew("pdf", "a", ttl_s=5, now=4)
    assert not leases.acquire("pdf", "b", limit=1, ttl_s=5, now=8)
    assert not leases.renew("pdf", "a", ttl_s=5, now=9.5)
    assert leases.acquire("pdf", "b", limit=1, ttl_s=5, now=9.5)


def test_acquiring_a_held_lease_again_renews_it_without_taking_a_second_slot():
    leases = ConcurrencyLeases()
    assert leases.acquire("pdf", "a", limit=1, ttl_s=5, now=0)
    assert leases.acquire("pdf", "a", limit=1, ttl_s=5, now=1)
    assert leases.held("pdf", now=1) == 1
