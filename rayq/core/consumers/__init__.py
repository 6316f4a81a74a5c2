"""What a consumer decides: how many pollers its hit rate allows (``balancer``), which
tasks it runs and how each delivery ends (``decisions``), and the counts and choices it
keeps between rounds (``state``)."""
