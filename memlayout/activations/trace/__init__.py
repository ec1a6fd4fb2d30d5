"""The trace of one step: the dispatch-mode tracer and its records, the world of fake, meta or real tensors it runs in,
fake CUDA, and the kernel tables that say what real kernels allocate."""
