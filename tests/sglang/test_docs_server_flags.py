"""Every SGLang server flag the docs show (on ``sglang.launch_server`` / ``sglang serve``, and in
``continuum-bench --server-args``) is one SGLang 0.5.23's ``ServerArgs`` parses. The commands are
found by ``tests/lab/test_docs_commands.py``; this half lives here because it imports SGLang."""

from __future__ import annotations

import argparse

import pytest

from tests.lab.test_docs_commands import server_flags
from tests.unit.test_docs import ROOT

pytestmark = pytest.mark.sglang


def test_every_server_flag_the_docs_show_is_sglangs():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    unknown = [
        f"{page.relative_to(ROOT)}:{number} {flag}" for page, number, flag in server_flags() if flag not in known
    ]
    assert not unknown, "\n".join(unknown)
