"""`python -m memlayout`."""

import sys

from memlayout.cli.app import main

sys.exit(main())
