"""`python -m memlayout`."""

from memlayout.cli.app import entry

entry()
