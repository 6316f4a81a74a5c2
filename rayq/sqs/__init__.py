"""The Amazon SQS JSON protocol over rayq.

Pure (no Ray): :mod:`~rayq.sqs.sigv4` (request signatures), :mod:`~rayq.sqs.errors`,
:mod:`~rayq.sqs.attributes`, :mod:`~rayq.sqs.messages` and :mod:`~rayq.sqs.batches`.
:mod:`~rayq.sqs.api` runs the operations over one rayq Client per account;
:mod:`rayq.sqs.service` serves it over HTTP from Ray actors.
"""
