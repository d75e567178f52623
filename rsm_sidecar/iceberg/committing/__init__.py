"""Data files written by the executors, committed by the driver with the exactly-once markers."""
