"""`python -m cli`: the console script without the installed entry point."""

import sys

from cli import main

sys.exit(main())
