"""``python -m tools.sm70proj`` from the repository root: the V100 projection (cli.py)."""

import sys

from .cli import main

sys.exit(main())
