"""``python -m sglang_continuum.cli.agents``."""

import sys

from sglang_continuum.cli.agents.fleet import main

sys.exit(main())
