"""`python -m nasplat.cli`: the `nasplat` command."""

import sys

from nasplat.cli import main

sys.exit(main())
