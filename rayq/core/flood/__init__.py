"""Flood detection and isolation: which (type, tenant) pairs flood (``detection``) and
where their messages move (``isolation``)."""
