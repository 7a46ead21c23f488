"""Performance: per-pass timing and memory, the static memory estimate, pre-packed weights."""
