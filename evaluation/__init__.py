"""Policies judged on this machine: sizes measured in rounds, regrets and paired savings with their
intervals, each policy charged its own decision, and `auto` wired to an engine. Above the engine and
the service, beside the profiler and training; the demo and the benches measure through it."""
