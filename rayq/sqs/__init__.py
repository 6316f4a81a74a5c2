"""The Amazon SQS JSON protocol over rayq, pure: request signing (SigV4), the
protocol's errors, queue attributes, message conversion and the operations.

No Ray here: :mod:`actors.sqs` serves it over HTTP from Ray actors and hands
the operations one rayq :class:`~rayq.client.Client` per account.
"""
