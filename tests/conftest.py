import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / ".models" / "tiny-llama"

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Servers started by the tests check every Continuum invariant while idle (a violation crashes
# the scheduler, which fails the test).
os.environ.setdefault("SGLANG_CONTINUUM_CHECK_INTEGRITY", "1")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    if not (TINY_MODEL / "continuum_tiny_model.json").exists():
        from sglang_continuum.tools.tiny_model import build

        build(TINY_MODEL)
    return str(TINY_MODEL)


@pytest.fixture(scope="session")
def vocab_size(tiny_model) -> int:
    import json

    return json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
