"""Benchmarks: each prints its numbers next to a baseline measured in the same run."""
