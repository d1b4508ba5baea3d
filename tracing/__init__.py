"""Trace ingest, per-device / per-range metrics and host-stall attribution. Needs no torch."""
