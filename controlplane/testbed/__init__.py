"""A testbed as data and the work on it: the inventory, how serve is reached
(serve_access), deploy and teardown, the data-plane probe, certificates, and the emulated
network (network namespaces and their address plan)."""
