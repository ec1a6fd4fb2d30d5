"""What every report is and where it goes: the formatter interface and the one writer.

Each command's formatters live with the command's results (`report/` for inspect,
`diff/`, `activations/`); the CLI maps a `--format` name to them in one place
(`memlayout.cli.formats`). Nothing here knows about tensors.
"""
