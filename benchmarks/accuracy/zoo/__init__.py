"""`make zoo`: memlayout activations swept over architectures it was not built against.

catalog.py lists them (transformers' auto-model registries, diffusers, torch.nn),
tiny.py makes transformers configs small, inputs.py and multimodal.py make their
inputs, check.py checks one architecture,
run.py runs the sweep, one fresh process per architecture, and render.py writes
docs/activations-zoo.md from the results.
"""
