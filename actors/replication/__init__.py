"""actors.replication."""
