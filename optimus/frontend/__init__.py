"""From what users have to a graph and patterns: capture, model specs, HuggingFace models, pattern files, starters."""
