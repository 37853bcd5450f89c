"""`python -m chunkpilot.cli`: the console script without the installed entry point."""

import sys

from chunkpilot.cli import main

sys.exit(main())
