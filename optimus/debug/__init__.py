"""Debugging tools over traces: why, bisect, repro, compare, the node inspector, code diff, rebuild."""
