from rayq.core.kit.renewed import MISSING, Renewed


def test_nothing_kept_is_read_now_and_a_fresh_value_is_not_renewed():
    cache = Renewed(ttl_s=2.0)
    assert cache.get("q", now=0.0) == (MISSING, False)
    assert cache.keep("q", 0.0, "v1") == "v1"
    assert cache.get("q", now=0.9) == ("v1", False)


def test_past_half_the_ttl_one_renewal_starts_and_the_value_still_serves():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "v1")
    assert cache.get("q", now=1.5) == ("v1", True)
    assert cache.get("q", now=1.6) == ("v1", False)  # under way
    cache.keep("q", 1.5, "v2")
    cache.renewed("q")
    assert cache.get("q", now=2.5) == ("v2", False)
    assert cache.get("q", now=3.0) == ("v2", True)  # the next one, once it ended


def test_past_the_ttl_the_value_is_read_again():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "v1")
    assert cache.get("q", now=2.0) == (MISSING, False)


def test_a_read_begun_before_a_change_or_a_later_read_is_not_kept():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "old")
    cache.changed("q", now=1.0)
    assert cache.get("q", now=1.1) == (MISSING, False)
    cache.keep("q", 0.5, "read before the change")
    assert cache.get("q", now=1.2) == (MISSING, False)
    cache.keep("q", 1.2, "new")
    cache.keep("q", 1.1, "an older read landing late")
    assert cache.get("q", now=1.3) == ("new", False)
