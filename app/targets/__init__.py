"""The targets: what the service monitors, configured, sent to the API or discovered."""
