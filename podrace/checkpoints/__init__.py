"""Checkpoints: what one holds (`state`), writing a step atomically with its manifest
(`files`), reading and verifying one (`read`), saving a run's state as it trains
(`saving`), and continuing a run from one (`resume`)."""
