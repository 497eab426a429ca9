"""The straggler policy: per-worker health from the counters (detect), the decisions
(policies), and the loop that applies them to a switch (runner)."""
