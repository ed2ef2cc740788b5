"""The lab beside the Continuum plugin: everything that exists to measure it.

It imports the product (``sglang_continuum``); the product never imports it. One direction of
dependency between its packages (a package imports only those above it in this list):

* ``workloads`` -- agent workloads: schema, generator, trace importers.
* ``harness``   -- starts and drives real SGLang: server launcher, router fleet, in-process scheduler.
* ``bench``     -- the policies compared (stock and the named Continuum variants), replay, reports, seeds.
* ``emulator``  -- SGLang's scheduler in virtual time, forwards timed by a profile.
* ``cli``       -- the command-line tools (``continuum-bench``, ``-profile``, ``-reliability``, ...).

The tools run from the repository root: the files of the checkout they default to (``configs/``,
``workloads/``, ``requirements/``, ``docs/results/``) are paths relative to it, never to where
this package is installed.
"""
