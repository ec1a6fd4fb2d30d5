"""One step as it runs: the training step, its optimizer, and the backward (where autograd sums gradients, and
memlayout's own loop for fake CUDA tensors)."""
