"""PromQL: its text and the Prometheus HTTP API client."""
