"""`python -m hysync.controlplane.cli`: the `hysync` command without its console script."""

import sys

from hysync.controlplane.cli.main import main

sys.exit(main())
