"""Sweeps: every model x configuration, each run isolated, one row per run."""
