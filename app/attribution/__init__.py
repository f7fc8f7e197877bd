"""What changed: a latency change explained by its cause (load, workload, configuration, a restart,
replicas, a neighbour), and the change events a target goes through. See docs/changes.md."""
