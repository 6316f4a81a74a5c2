"""The event log (Parquet, partitioned by date and hour) and the Spark report over it."""
