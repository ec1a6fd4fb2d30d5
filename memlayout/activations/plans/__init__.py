"""Checkpoint plans: the pure planner, applying a plan to a live model, and the rerun signal a checkpointed module gives
the trace."""
