"""The control plane: the queue and task registries and placement (``registry``,
``placement``), subqueue and consumer scaling (``scaling``), clients' cached routes
(``routes``), the manager's rules (``managing``), where handlers run as Ray tasks
(``ray_tasks``), and the control stores kept replicated (``control_places``,
``control_store``)."""
