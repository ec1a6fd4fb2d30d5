"""The device a step targets: the GPU table, the CUDA caching allocator's model and its replay, the CUDA runtime's own
memory, and SDPA's kernel choice."""
