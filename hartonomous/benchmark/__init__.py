"""`hartonomous bench`: latency, scaling, ingest, throughput and concurrency measurements.

Benchmarks report what they measured, with the machine and the command; they are never tests.
"""
