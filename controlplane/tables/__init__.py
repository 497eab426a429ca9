"""What the HySync program's tables and counters hold, one module per P4 control: admission,
sync modes, forwarding, replication, counters; and the jobs read back from them (installed)."""
