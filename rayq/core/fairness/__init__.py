"""Fairness across job types and tenants: usage, victims and listen order (``policy``),
the coordinator's rounds (``coordinating``), suspension rules (``rules``),
cluster-wide concurrency leases (``leases``) and the tallies of ended deliveries
(``tallies``)."""
