"""Codecs and the value types every wing shares: messages, receipts and the body codec
(``model``), the msgpack batches that cross Ray (``wire``), the local channel's frames
(``frames``) and the call, outcome and usage report a task message carries (``tasks``)."""
