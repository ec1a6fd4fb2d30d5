"""inspect's formats: each turns a `BatchReport` into text and never prints.

One module per format (table, json_report, sarif, github, markdown, junit, html),
each a `memlayout.output.interface.Formatter`. Which one renders which `--format`
is decided in one place, `memlayout.cli.formats.to_format`.
"""
