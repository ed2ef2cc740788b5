"""``python -m continuum_lab.cli.reliability``."""

import sys

from continuum_lab.cli.reliability.driver import main

sys.exit(main())
