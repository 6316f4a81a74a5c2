"""The Ray actors of a runtime, thin around rayq.core: shards, consumers, the control
plane's actors, replication's actor side. The client layer (rayq.client, rayq.cli,
rayq.runtime, the SQS service) starts and calls them; they never import it."""
