"""Starting and serving a runtime: ``session`` (``rayq.start``, ``rayq.connect``),
``local`` (a Ray head that outlives one script) and ``serving`` (the SQS endpoint)."""
