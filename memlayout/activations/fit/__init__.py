"""What fits: the largest batch or the longest sequence under a budget, and the probes that trace one size."""
