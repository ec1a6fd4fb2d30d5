"""One request for a step: every setting of `memlayout activations`, checked once, passed down whole.

`StepRequest` (step_request.py) holds what a prediction is asked for: the target, its
inputs, the step, the device, the precision, the budget and the plans, the ranks, the
adapters and the output. The command line builds it from its flags and the project's
`[tool.memlayout.activations]` (config_file.py); a Python caller builds the same object,
or passes the same settings by name to `analyze`, `analyze_ranks`, `fit` and
`weights_report`. Every rule between settings is checked when it is made (rules.py),
and the names of steps, optimizers, precisions and the rest have their one home in
vocabulary.py. Nothing here imports torch, or anything `memlayout inspect` does not.
"""
