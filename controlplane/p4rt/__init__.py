"""P4Runtime: one session with a switch (arbitration, pipeline push, reads, writes), the
entities it carries, transactions that roll back, and the device config of a target."""
