"""``continuum-top``: a Continuum server's live programs in a terminal.

Polls SGLang's ``GET /server_info``, where under ``--schedule-policy continuum`` every
data-parallel rank's scheduler answers with its live view under ``"continuum"``
(``adapter/introspection.py``; the shape is ``core/snapshot.py``'s), and redraws one line per rank,
then one row per program (docs/live-view.md says what each column means)::

    continuum-top --url http://localhost:30000 [--interval 2] [--once]

``q`` or Ctrl-C quits. ``--once`` prints one frame and exits, for scripts: 0, or 1 when the server
cannot be reached, or 2 when it does not run the continuum policy (no view in its answer). The
standard library only, and no import of the plugin: it runs on any machine with Python, without
SGLang.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import time
import urllib.error
import urllib.request
from typing import Optional, TextIO

KNOWN_VERSION = 1  # the newest view shape this reader knows (``snapshot.VERSION``)
ENDPOINTS = ("/server_info", "/get_server_info")  # the second: SGLang's older, deprecated name
HTTP_TIMEOUT_S = 10.0  # a scheduler answers control requests between steps: a long prefill delays it
EXIT_UNREACHABLE, EXIT_NOT_CONTINUUM = 1, 2
# (header, width) of each column before the last decision, which takes what the line has left;
# the program column is as wide as the longest id shown, at most ``ID_WIDTH``
ID_WIDTH = 24
COLUMNS = (
    ("PROGRAM", ID_WIDTH),
    ("STATE", 8),
    ("FOR", 7),
    ("TURNS", 7),
    ("CONTEXT", 8),
    ("PINNED", 8),
    ("LEFT", 7),
    ("HOST", 7),
    ("CACHED", 7),
)


class NotContinuum(RuntimeError):
    """The server answered, but none of its ranks carries a live view."""


class Unreachable(RuntimeError):
    """The server could not be asked (refused, timed out, an HTTP error)."""


def fetch(url: str, *, api_key: Optional[str] = None, timeout: float = HTTP_TIMEOUT_S) -> list[dict]:
    """Each rank's live view from ``url``'s ``/server_info`` (its older name where that one is missing)."""
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for path in ENDPOINTS:
        request = urllib.request.Request(url.rstrip("/") + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                body = json.loads(response.read())
            break
        except urllib.error.HTTPError as e:
            if e.code == 404 and path != ENDPOINTS[-1]:
                continue
            hint = " (pass --api-key)" if e.code in (401, 403) else ""
            raise Unreachable(f"{url}{path} answered HTTP {e.code}{hint}") from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise Unreachable(f"cannot reach {url}: {reason}") from e
    states = body.get("internal_states") if isinstance(body, dict) else None
    views = [s["continuum"] for s in states or () if isinstance(s, dict) and isinstance(s.get("continuum"), dict)]
    if not views:
        raise NotContinuum(
            f'{url} does not run the continuum policy: its /server_info carries no "continuum" view '
            "(start it with --schedule-policy continuum and the sglang-continuum plugin installed)"
        )
    return sorted(views, key=lambda v: v.get("server", {}).get("dp_rank") or 0)


# -- one frame -----------------------------------------------------------------------------------
def _clean(value) -> str:
    """What a server sent, safe to print: no control characters reach the terminal."""
    text = "" if value is None else str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def _tokens(n) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 100_000:
        return f"{n / 1e3:.0f}k"
    return str(int(n))


def _secs(s) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 100:
        return f"{s / 60:.1f}m"
    return f"{s:.1f}s"


def _share(x) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) else "-"


def server_lines(view: dict) -> list[str]:
    """Two lines about one rank: its memory and door, then its programs and the policy in force."""
    s = view.get("server", {})
    settings = s.get("settings", {})
    host = (
        f"host {_tokens(s.get('host_pinned_tokens'))}/{_tokens(s.get('host_pin_budget_tokens'))} tok"
        if s.get("host_tier")
        else "host tier off"
    )
    first = (
        f"dp{s.get('dp_rank', 0)}  pool {_tokens(s.get('pool_tokens'))} tok  "
        f"pinned {_tokens(s.get('pinned_tokens'))}/{_tokens(s.get('pin_budget_tokens'))} tok "
        f"({s.get('pinned_programs', 0)} programs)  {host}  "
        f"held at the door {s.get('held_turns', 0)} (longest {_secs(s.get('longest_hold_s'))})  "
        f"working set {_tokens(s.get('working_set_tokens'))} tok (reserved {_tokens(s.get('working_set_reserved_tokens'))})"
    )
    omitted = s.get("programs_omitted", 0)
    second = (
        f"     programs {s.get('programs_live', 0)} live"
        + (f", {omitted} not shown" if omitted else "")
        + f"  rules {_clean(s.get('rules'))}, ttl {_clean(s.get('ttl_model'))}"
        f"  max ttl {_secs(settings.get('max_ttl_s'))}, max hold {_secs(settings.get('max_hold_s'))}"
        f"  admission control {'on' if settings.get('admission_control') else 'off'}"
    )
    return [first, second]


def _shown_id(row: dict) -> str:
    return _clean(row.get("id")) + ("*" if row.get("scoped") else "")  # *: scoped, its tenant's own


def _widths(rows: list[dict]) -> list[int]:
    ids = max((len(_shown_id(row)) for row in rows), default=0)
    return [min(ID_WIDTH, max(len("PROGRAM"), ids)), *(w for _, w in COLUMNS[1:])]


def program_row(row: dict, widths: list[int], *, rank: Optional[int] = None) -> str:
    turns = f"{row.get('turns_admitted', 0)}/{row.get('turns_finished', 0)}"
    state = _clean(row.get("state"))
    cells = (
        _shown_id(row),
        state,
        _secs(row.get("for_s")),
        turns,
        _tokens(row.get("context_tokens")),
        _tokens(row.get("pinned_tokens")) if row.get("pinned_tokens") else "-",
        _secs(row.get("pin_left_s")),
        _tokens(row.get("host_pinned_tokens")) if row.get("host_pinned_tokens") else "-",
        _share(row.get("cached_share")),
    )
    line = " ".join(_fit(cell, width) for cell, width in zip(cells, widths))
    prefix = f"{rank:<3} " if rank is not None else ""
    return prefix + line + " " + _clean(row.get("last_decision"))


def _fit(text: str, width: int) -> str:
    return (text if len(text) <= width else text[: width - 1] + "~").ljust(width)


def render(views: list[dict], *, url: str, interval: Optional[float], width: int, height: Optional[int]) -> list[str]:
    """One frame: a title, each rank's lines, the column heads, a row per program (as many as
    ``height`` leaves room for; None: all), each line cut to ``width``."""
    title = f"continuum-top  {url}  {time.strftime('%H:%M:%S')}"
    title += f"  every {interval:g} s  (q quits)" if interval is not None else ""
    if any(v.get("version", KNOWN_VERSION) > KNOWN_VERSION for v in views):
        title += "  [a newer server: some fields not shown]"
    lines = [title]
    for view in views:
        lines += server_lines(view)
    several = len(views) > 1
    shown = [row for view in views for row in view.get("programs", ())]
    widths = _widths(shown)
    heads = " ".join(_fit(name, w) for (name, _), w in zip(COLUMNS, widths)) + " LAST DECISION"
    lines.append(("DP  " if several else "") + heads)
    rows = [
        program_row(row, widths, rank=view.get("server", {}).get("dp_rank", 0) if several else None)
        for view in views
        for row in view.get("programs", ())
    ]
    presumed = [p for view in views for p in view.get("presumed_ended", ())]
    footer = []
    if presumed:
        gone = ", ".join(
            f"{_clean(p.get('id'))} ({_clean(p.get('tool'))}, {_secs(p.get('away_s'))} away)" for p in presumed
        )
        footer.append("presumed ended lately: " + gone)
    if not rows:
        rows = ["(no live programs)"]
    room = None if height is None else max(1, height - len(lines) - len(footer))
    if room is not None and len(rows) > room:
        rows = rows[: room - 1] + [f"... {len(rows) - room + 1} more rows (a taller terminal shows them)"]
    return [line[:width] for line in lines + rows + footer]


# -- the terminal --------------------------------------------------------------------------------
class Screen:
    """Redraws in place on a terminal (alternate screen, keys read one at a time); elsewhere
    (a pipe, a file) each frame is printed after the last."""

    def __init__(self, out: TextIO, keys: TextIO) -> None:
        self.out, self.keys = out, keys
        self.tty = out.isatty() and keys.isatty()
        self._saved = None

    def __enter__(self) -> "Screen":
        if self.tty:
            import termios
            import tty

            self._saved = termios.tcgetattr(self.keys.fileno())
            tty.setcbreak(self.keys.fileno())  # keys without Enter; Ctrl-C still interrupts
            self.out.write("\x1b[?1049h\x1b[?25l")  # alternate screen, cursor hidden
        return self

    def __exit__(self, *exc) -> None:
        if self.tty:
            import termios

            self.out.write("\x1b[?25h\x1b[?1049l")
            self.out.flush()
            termios.tcsetattr(self.keys.fileno(), termios.TCSADRAIN, self._saved)

    def size(self) -> tuple[int, Optional[int]]:
        """The terminal's size now (not ``COLUMNS``, which a shell sets once and a resize leaves
        stale); off a terminal, lines of at least 160 columns and every row."""
        if not self.tty:
            return max(shutil.get_terminal_size().columns, 160), None
        try:
            size = os.get_terminal_size(self.out.fileno())
        except OSError:
            size = shutil.get_terminal_size()
        return size.columns, size.lines

    def draw(self, lines: list[str]) -> None:
        if self.tty:  # home, each line over the last frame's, then clear what is left below
            self.out.write("\x1b[H" + "".join(line + "\x1b[K\n" for line in lines) + "\x1b[J")
        else:
            self.out.write("\n".join(lines) + "\n\n")
        self.out.flush()

    def wait_for_quit(self, seconds: float) -> bool:
        """Wait ``seconds``; True if ``q`` was pressed meanwhile."""
        deadline = time.monotonic() + seconds
        while self.tty:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.keys], [], [], left)
            if ready and os.read(self.keys.fileno(), 1) in (b"q", b"Q"):
                return True
        time.sleep(max(0.0, seconds))
        return False


def _frame(args, screen: Screen) -> list[str]:
    """The next frame; a server that cannot be reached is said so, and asked again at the next one."""
    width, height = screen.size()
    try:
        views = fetch(args.url, api_key=args.api_key)
    except Unreachable as e:
        return [
            f"continuum-top  {args.url}  {time.strftime('%H:%M:%S')}",
            f"{e}; trying again every {args.interval:g} s",
        ]
    return render(views, url=args.url, interval=args.interval, width=width, height=height)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="continuum-top", description="A Continuum server's live programs (SGLang's /server_info), refreshed."
    )
    parser.add_argument("--url", default="http://localhost:30000", help="the SGLang server (default: %(default)s)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit (for scripts)")
    parser.add_argument("--api-key", default=None, help="the server's --api-key, if it was started with one")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.once:
            try:
                views = fetch(args.url, api_key=args.api_key)
            except Unreachable as e:
                print(f"continuum-top: {e}", file=sys.stderr)
                return EXIT_UNREACHABLE
            width = max(shutil.get_terminal_size().columns, 160)
            print("\n".join(render(views, url=args.url, interval=None, width=width, height=None)))
            return 0
        with Screen(sys.stdout, sys.stdin) as screen:
            while True:
                screen.draw(_frame(args, screen))
                if screen.wait_for_quit(args.interval):
                    return 0
    except NotContinuum as e:
        print(f"continuum-top: {e}", file=sys.stderr)
        return EXIT_NOT_CONTINUUM
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
