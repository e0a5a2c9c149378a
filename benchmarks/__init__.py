"""Every benchmark: the modules of `hartonomous bench` / `hartonomous cluster bench` and the stand-alone
scripts (README.md indexes both).

Above the runtime and the build: it may import `hartonomous` and `projection`; only the composition
root, hartonomous/cli.py, imports it. Benchmarks report what they measured, with the machine and the
command; they are never tests.
"""
