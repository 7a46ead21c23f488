"""Guided walks through the predefined patterns."""
