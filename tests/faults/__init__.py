"""The fault suite: the scenarios of `testbed.faults` with a small load, seconds each."""
