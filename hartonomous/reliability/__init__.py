"""Reliability tooling: the HTTP load generator (`python -m hartonomous.reliability.load`)."""
