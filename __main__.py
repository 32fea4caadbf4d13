"""`python -m zerotune` is the `zerotune` command."""

import sys

from zerotune.cli import main

sys.exit(main())
