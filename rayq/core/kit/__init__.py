"""The kit: small tools every wing uses. Injected time (``clock``), back-off (``retry``),
group commit as a policy (``batcher``), the ordered key-value layer (``kv``), circular
time windows (``windows``), bounded persisted histories (``history``) and bounded
metric label sets (``metrics``). The kit imports nothing else of rayq but its errors."""
