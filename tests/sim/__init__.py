"""A deterministic simulation of a HySync job (docs/protocol.md §10).

The real worker engines (native/worker, their in-memory backend) and a real switch
pipeline (the native data plane, the Python reference model, the TNA model) exchange
datagrams over a simulated network on a simulated clock, in one process, driven by one
seeded scheduler: a seed is a complete, replayable run. `plan` draws a run's job and
faults from its seed, `run` plays it, `check` holds it to the protocol's invariants,
`python -m tests.sim` (`make simulate`) runs many seeds and shrinks a failure.
"""
