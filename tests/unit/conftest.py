"""Unit tests are pure: touching Ray from one of them fails loudly."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    class _Forbidden:
        def __getattr__(self, name):
            if name.startswith("__"):  # introspection (hypothesis scans sys.modules), not use
                raise AttributeError(name)
            raise AssertionError(f"unit tests must not use ray (ray.{name})")

    monkeypatch.setitem(sys.modules, "ray", _Forbidden())
    yield
