"""Runs a question end to end: one inspection, several paths, baselines and config."""
