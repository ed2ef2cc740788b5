"""What the docs promise a reader: every link, anchor and image they show resolves, every name
they write (setting, environment variable, Prometheus series, repository path, SGLang hook) is one
the code has today, the figures they restate from the code and the shipped config file are the
code's, the README's gains table says what the results index says, user pages carry no workshop
vocabulary, and ``docs/results/`` stays a curated size (results a reader can trust, not a run
archive). Each failure lists ``file:line name``. Command-line flags: ``tests/lab/test_docs_commands.py``
(the lab's commands) and ``tests/sglang/test_docs_server_flags.py`` (SGLang's server flags).

A block of a page between ``<!-- historical -->`` and ``<!-- /historical -->`` records a run as it
was made (names since retired); the name checks skip it."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Iterator

import tomllib

from sglang_continuum.core import door, offload, residency, series
from sglang_continuum.core.settings import CONFIG_ENV, ENV_PREFIX, ContinuumSettings

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MAX_RESULTS_FILES = 150
MAX_DOCS_BYTES = 5 * 2**20
HISTORICAL_START, HISTORICAL_END = "<!-- historical -->", "<!-- /historical -->"


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _doc_pages() -> list[Path]:
    """README and every page under docs/ (the changelog is history: it names what was retired)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _user_pages() -> list[Path]:
    """The pages an operator reads: README and docs/*.md (results pages are run records)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _lines(page: Path, *, historical_too: bool = False) -> Iterator[tuple[int, str, bool]]:
    """(number, line, inside a fenced code block) for each line outside historical blocks (or of
    every line, ``historical_too``: a link resolves wherever it is written)."""
    fenced = historical = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.strip() == HISTORICAL_START:
            historical = True
        elif line.strip() == HISTORICAL_END:
            historical = False
        elif line.lstrip().startswith("```"):
            fenced = not fenced
        elif historical_too or not historical:
            yield number, line, fenced


def _where(page: Path, number: int, name: str) -> str:
    return f"{page.relative_to(ROOT)}:{number} {name}"


def _targets(page: Path):
    for number, line, fenced in _lines(page, historical_too=True):
        if fenced:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            yield number, target.split("#", 1)[0]


def test_every_relative_link_and_image_in_the_docs_resolves():
    broken = [
        _where(page, number, target)
        for page in _pages()
        for number, target in _targets(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, "\n".join(broken)


@functools.cache
def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered), and its explicit ``<a id="...">``."""
    seen: dict[str, int] = {name: 0 for name in re.findall(r'<a id="([^"]+)"', page.read_text())}
    for _, line, fenced in _lines(page):
        if not fenced and re.match(r"#{1,6} ", line):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_anchor_the_docs_link_to_is_a_heading():
    broken = []
    for page in _pages():
        for number, line, fenced in _lines(page, historical_too=True):
            for target in [] if fenced else LINK.findall(line):
                path, _, anchor = target.partition("#")
                if not anchor or re.match(r"[a-z]+:", target):
                    continue
                linked = page.parent / path if path else page
                if linked.suffix == ".md" and linked.exists() and anchor not in _anchors(linked):
                    broken.append(_where(page, number, target))
    assert not broken, "\n".join(broken)


def test_docs_stay_a_curated_size():
    """The results are the claims a reader can trust, not a run archive: their file count is held;
    the pages an operator reads (docs/*.md) are not counted."""
    results = [p for p in (ROOT / "docs" / "results").rglob("*") if p.is_file()]
    assert len(results) < MAX_RESULTS_FILES, f"{len(results)} files under docs/results/"
    files = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < MAX_DOCS_BYTES


# --- settings ------------------------------------------------------------------------------------

ENV_NAME = re.compile(re.escape(ENV_PREFIX) + r"[A-Z0-9_]*[A-Z0-9]")


def test_every_environment_setting_the_docs_name_exists():
    known = {ENV_PREFIX + name.upper() for name in ContinuumSettings.model_fields} | {CONFIG_ENV}
    retired = [
        _where(page, number, name)
        for page in _doc_pages()
        for number, line, _ in _lines(page)
        for name in ENV_NAME.findall(line)
        if name not in known
    ]
    assert not retired, "\n".join(retired)


def _settings_table() -> list[tuple[int, str, str]]:
    """(line, setting, default) of each row of docs/settings.md's settings table."""
    rows = []
    for number, line, fenced in _lines(ROOT / "docs" / "settings.md"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not fenced and line.startswith("| `") and len(cells) >= 3:
            rows.append((number, cells[0].strip("`"), cells[1]))
    return rows


def _written(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value) if value else "(none)"
    return str(value)


def test_every_setting_is_documented_with_its_default():
    page = ROOT / "docs" / "settings.md"
    fields = ContinuumSettings.model_fields
    rows = _settings_table()
    wrong = [_where(page, n, name) for n, name, _ in rows if name not in fields]
    wrong += [
        _where(page, n, f"{name} default {default} (code: {_written(fields[name].default)})")
        for n, name, default in rows
        if name in fields and default != _written(fields[name].default)
    ]
    documented = {name for _, name, _ in rows}
    wrong += [f"docs/settings.md:0 {name} (not documented)" for name in fields if name not in documented]
    assert not wrong, "\n".join(wrong)


CONFIG = ROOT / "configs" / "continuum.toml"
# numbers the config file's comments state, and the constants they restate
CONFIG_FIGURES = {
    r"resident programs' pins up to (\d+(?:\.\d+)?)": residency.RESIDENT_PIN_SHARE,
    r"(\d+(?:\.\d+)?) GB/s until": offload.DEFAULT_HOST_BYTES_PER_S / 1e9,
}


def test_the_shipped_config_file_is_the_defaults():
    text = CONFIG.read_text()
    values = tomllib.loads(text)
    fields = ContinuumSettings.model_fields
    wrong = [f"configs/continuum.toml {name} (no such setting)" for name in values if name not in fields]
    for name, field in fields.items():
        if name in values:
            value = tuple(values[name]) if isinstance(values[name], list) else values[name]
            if value != field.default:
                wrong.append(f"configs/continuum.toml {name} = {values[name]!r} (default {field.default!r})")
        elif field.default is not None:
            wrong.append(f"configs/continuum.toml {name} commented out, but its default is {field.default!r}")
        elif not re.search(rf"^# {name} = ", text, re.M):
            wrong.append(f"configs/continuum.toml {name} (no example line)")
    stated = set()
    for number, line in enumerate(text.splitlines(), 1):
        comment = line.split("#", 1)[1] if "#" in line else ""
        for pattern, constant in CONFIG_FIGURES.items():
            for figure in re.findall(pattern, comment):
                stated.add(pattern)
                if float(figure) != constant:
                    wrong.append(f"configs/continuum.toml:{number} {figure} (code: {constant:g})")
    wrong += [f"configs/continuum.toml: no comment states {p!r}" for p in CONFIG_FIGURES if p not in stated]
    assert not wrong, "\n".join(wrong)


# --- Prometheus series ---------------------------------------------------------------------------

# the scraped name, or the one SGLang's router shows (``:`` rewritten to ``_`` as it aggregates)
SERIES_NAME = re.compile(r"sglang[:_]continuum_[a-z0-9_]*[a-z0-9]")


def _scraped_names() -> set[str]:
    """Every name a scrape shows: counters' ``_total`` (series.Series.name), histograms' parts."""
    names = set()
    for s in series.SERIES:
        names.add(s.name)
        if s.kind == "histogram":
            names.update(s.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def test_every_series_the_docs_name_is_exported():
    names = _scraped_names()
    unknown = [
        _where(page, number, name)
        for page in _doc_pages()
        for number, line, _ in _lines(page)
        for name in SERIES_NAME.findall(line)
        if name.replace("sglang_", "sglang:", 1) not in names
    ]
    assert not unknown, "\n".join(unknown)


# --- repository paths ----------------------------------------------------------------------------

REPO_PATH = re.compile(
    r"`((?:\./)?(?:configs|scripts|lab|docs|workloads|sglang_continuum|tests|cpushim|gpushim|requirements|core|adapter|client|\.models|\.ci)"
    r"/[^`\s*<>{}]*)`"
)
PACKAGE_DIRS = ("core/", "adapter/", "client/")  # written relative to sglang_continuum/


def _missing(path: str) -> bool:
    path, _, test = path.removeprefix("./").partition("::")
    path = re.sub(r":\d[\d,-]*$", "", path)
    target = ROOT / ("sglang_continuum/" + path if path.startswith(PACKAGE_DIRS) else path)
    if not target.exists():
        return True
    return bool(test) and not re.search(rf"^\s*(?:async )?def {re.escape(test)}\(", target.read_text(), re.M)


def test_every_repository_path_the_docs_name_exists():
    missing = [
        _where(page, number, path)
        for page in _doc_pages()
        for number, line, _ in _lines(page)
        for path in REPO_PATH.findall(line)
        if _missing(path)
    ]
    assert not missing, "\n".join(missing)


# --- words that belong to the project's workshop, not to an operator's page ----------------------

# on every page: where the work was tracked and how the code is carved up
WORKSHOP = re.compile(r"\bissue \d+|\bthe issue's\b|\brooms\b|\b(?:one|each) room\b|\blent\b", re.I)
# on the pages an operator reads (results pages' commands record where a run wrote)
MACHINE = re.compile(r"/work/|\.\./shared\b")


def test_the_docs_carry_no_internal_vocabulary():
    user = set(_user_pages())
    found = [
        _where(page, number, match.group(0))
        for page in _doc_pages()
        for number, line, _ in _lines(page)
        for pattern in ((WORKSHOP, MACHINE) if page in user else (WORKSHOP,))
        for match in pattern.finditer(line)
    ]
    assert not found, "\n".join(found)


def test_the_layout_page_names_every_sglang_hook_the_plugin_installs():
    """``Class.method`` of each ``sglang.srt`` target the adapter hooks is in docs/layout.md."""
    text = (ROOT / "docs" / "layout.md").read_text()
    missing = []
    for path in sorted((ROOT / "sglang_continuum" / "adapter").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            target = re.match(r'^[A-Z_]+ = "sglang\.srt\.([\w.]+)"$', line)
            if target and ".".join(target.group(1).split(".")[-2:]) not in text:
                missing.append(f"{path.relative_to(ROOT)}:{number} {target.group(1)}")
    assert not missing, "\n".join(missing)


# --- the README's gains table against the results index ------------------------------------------

FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?(?:x\b|%| s\b)")


def _table_rows(page: Path, section: str | None = None) -> Iterator[tuple[int, list[str]]]:
    """(line, cells) of each body row of the page's tables (of one ``## section`` if named)."""
    inside = section is None
    for number, line, fenced in _lines(page):
        if line.startswith("## "):
            inside = section is None or line[3:].strip() == section
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if inside and not fenced and line.startswith("|") and not set(line) <= set("|-: "):
            if not (cells and cells[0] in ("claim", "page") or cells[0].startswith("regime")):
                yield number, cells


def _pages_linked(page: Path, cell: str) -> set[str]:
    """Each relative link of a cell as a repository path, with its anchor."""
    keys = set()
    for target in LINK.findall(cell):
        path, _, anchor = target.partition("#")
        keys.add(str((page.parent / path).resolve().relative_to(ROOT)) + (f"#{anchor}" if anchor else ""))
    return keys


def test_every_readme_gain_is_the_results_index_figure():
    """Each row of the README's gains tables links a result page; some row of the results index that
    links the same page (and anchor) carries every figure (ratio, share, seconds) the README row
    states."""
    readme, index = ROOT / "README.md", ROOT / "docs" / "results" / "README.md"
    by_page: dict[str, list[str]] = {}
    for _, cells in _table_rows(index):
        for key in _pages_linked(index, cells[-1]):
            by_page.setdefault(key, []).append(" | ".join(cells[:-1]))
    rows = list(_table_rows(readme, "What it gains"))
    wrong = []
    for number, cells in rows:
        keys = _pages_linked(readme, cells[-1])
        figures = set(FIGURE.findall(" | ".join(cells[:-1])))
        candidates = [set(FIGURE.findall(text)) for key in keys for text in by_page.get(key, [])]
        if not candidates:
            wrong.append(f"README.md:{number} {sorted(keys)} (no results index row links it)")
        elif not any(figures <= found for found in candidates):
            best = min(candidates, key=lambda found: len(figures - found))
            wrong.append(f"README.md:{number} {sorted(figures - best)} (not in the index row of {sorted(keys)})")
    assert rows, "README.md has no gains table under '## What it gains'"
    assert not wrong, "\n".join(wrong)


# numbers the user pages state, and the code they restate (a pattern's group is the figure)
PAGE_FIGURES = {
    r"`max_hold_s`[^.;]{0,40}?\b(\d+(?:\.\d+)?) s\b": ContinuumSettings.model_fields["max_hold_s"].default,
    r"(?:fill|up to) (\d+)% of the pool": residency.RESIDENT_PIN_SHARE * 100,
    r"resident programs' pins[^.]{0,80}?up to (\d\.\d+)": residency.RESIDENT_PIN_SHARE,
    r"unseen for (\d+) s(?=[^.]*(?:KV waits on host|pin or not))": door.HOST_TIER_WORKING_SET_WINDOW_S,
    r"after (\d+) s unseen": door.WORKING_SET_WINDOW_S,
    r"(?:at\s+most|count\s+at|these)\s+(fifteen|sixteen|seventeen|eighteen|nineteen|twenty)\b": len(
        ContinuumSettings.model_fields
    ),
}
WORD_NUMBERS = {"fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20}


def test_figures_the_user_pages_restate_are_the_codes():
    wrong = []
    for page in _user_pages():
        text = page.read_text()
        flat = text.replace("\n", " ")
        for pattern, constant in PAGE_FIGURES.items():
            for match in re.finditer(pattern, flat):
                if float(WORD_NUMBERS.get(match.group(1), match.group(1))) != constant:
                    number = text.count("\n", 0, match.start()) + 1
                    wrong.append(_where(page, number, f"{match.group(0)!r} (code: {constant:g})"))
    assert not wrong, "\n".join(wrong)


SHORT_COUNTER = re.compile(r"`(?!sglang)([a-z][a-z0-9_]*_total)(?:\{[^`]*\})?`")


def test_every_counter_the_user_pages_name_without_its_prefix_is_exported():
    """A backticked ``..._total`` (the prefix left off) is a counter of series.py."""
    counters = {s.short + "_total" for s in series.SERIES if s.kind == "counter"}
    unknown = [
        _where(page, number, name)
        for page in _user_pages()
        for number, line, _ in _lines(page)
        for name in SHORT_COUNTER.findall(line)
        if name not in counters
    ]
    assert not unknown, "\n".join(unknown)


def test_the_readme_stays_a_one_screen_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 120, f"README.md has {lines} lines (at most 120: the rest belongs in docs/)"
