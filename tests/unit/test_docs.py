"""What the docs promise a reader: every link and image they show resolves, and ``docs/`` stays
the curated size issue 39 set (results a reader can trust, not a run archive)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MAX_DOCS_FILES = 160
MAX_DOCS_BYTES = 5 * 2**20


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _targets(page: Path):
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            yield number, target.split("#", 1)[0]


def test_every_relative_link_and_image_in_the_docs_resolves():
    broken = [
        f"{page.relative_to(ROOT)}:{number} {target}"
        for page in _pages()
        for number, target in _targets(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_docs_stay_a_curated_size():
    files = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert len(files) < MAX_DOCS_FILES, f"{len(files)} files under docs/"
    assert sum(p.stat().st_size for p in files) < MAX_DOCS_BYTES
