"""The core: traces, op facts, pattern kinds, the match language, the Rewriter, search, recording, verification and the engine."""
