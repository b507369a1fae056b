"""`python -m ssd.cli ...`: the `ssd` command, as the launcher and the deployments run each service."""
import sys

from ssd.cli.app import main

sys.exit(main())
