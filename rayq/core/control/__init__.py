"""The control plane: the queue registry and placement (``registry``), subqueue scaling
(``scaling``), clients' cached routes (``routes``), the manager's rules (``managing``),
and what a consumer decides (``consuming``, with the hit-rate ``balancer``)."""
