"""``python -m sglang_continuum.cli.reliability``."""

import sys

from sglang_continuum.cli.reliability.driver import main

sys.exit(main())
