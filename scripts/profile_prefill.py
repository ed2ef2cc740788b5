#!/usr/bin/env python
"""Prefill profiler (see sglang_continuum/tools/profiler.py for the method)."""
import sys

from sglang_continuum.tools.profiler import main

sys.exit(main())
