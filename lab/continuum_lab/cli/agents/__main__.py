"""``python -m continuum_lab.cli.agents``."""

import sys

from continuum_lab.cli.agents.fleet import main

sys.exit(main())
