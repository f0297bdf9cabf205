"""bloomline's benchmarks, each run as ``python -m benchmarks.<name>`` from the repository root
(``make bench-<name>``). Every benchmark module has ``measure(args) -> dict`` (the timings,
nothing printed but progress) and ``report(dict)`` (the table and the targets); the shared
parts are in ``benchmarks.harness``. What each measures and its last result: README.md.
"""
