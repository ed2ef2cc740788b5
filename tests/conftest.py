import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ROOT / ".models" / "tiny-llama"

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Servers started by the tests check every Continuum invariant while idle (a violation crashes
# the scheduler, which fails the test).
os.environ.setdefault("SGLANG_CONTINUUM_CHECK_INTEGRITY", "1")
# ... and run SGLang's own strict checks (off by default in 0.5.23): pool accounting after every
# step (available + evictable + protected == total, so every pin must be a counted tree lock),
# no KV page both owned and free, and the radix tree's sanity check (SGLang runs it only for
# hybrid models; ContinuumRadixCache.check_integrity runs it too). Inherited by every server and
# in-process scheduler the tests start.
STRICT_CHECKS = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    "SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK": "1",
}
for name, value in STRICT_CHECKS.items():
    os.environ.setdefault(name, value)

# Property tests replay the same examples on every run (a draw that fails in CI fails here too,
# and a green run stays green); HYPOTHESIS_PROFILE=explore draws fresh examples to hunt for cases.
hypothesis_settings.register_profile("replay", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replay"))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    if not (TINY_MODEL / "continuum_tiny_model.json").exists():
        from continuum_lab.harness.tiny_model import build

        build(TINY_MODEL)
    return str(TINY_MODEL)


@pytest.fixture(scope="session")
def vocab_size(tiny_model) -> int:
    import json

    return json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
