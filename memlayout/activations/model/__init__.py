"""The model a step runs: what TARGET names, the model built on tensors without memory, the `--input` shorthand."""
