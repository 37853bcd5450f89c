"""Policies raced on this machine: sizes measured in rounds, each policy's decisions timed and
charged to it, `auto` wired to an engine, scored by the judge (judge/). Above the engine and
the service, beside the profiler and training; the demo and the benches measure through it."""
