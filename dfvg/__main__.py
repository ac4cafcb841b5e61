"""`python -m dfvg` is the `dfvg` command."""

import sys

from dfvg.cli import main

sys.exit(main())
