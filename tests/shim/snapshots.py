"""`tests/snapshots/shim-output.md`: every text `crew` prints, one section per case.

Each test renders a case (command, exit code, stdout, stderr) with ids, times
and ports normalised, and compares it with its section. `UPDATE_SNAPSHOTS=1`
rewrites the file from the sections the run produced, so run the whole of
`tests/shim` when updating (sections of cases that no longer exist go away);
review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SNAPSHOT_FILE = Path(__file__).resolve().parents[1] / "snapshots" / "shim-output.md"
FENCE = "````"

_HEADER = """\
# `crew` output snapshots

Every text the `crew` command prints, fixed by `tests/shim/` (each section is
one case run against a real `crew-server`). Ids are replaced by names
(`<group>`, `<id-1>` …), local times by `<local time>`, clock times in message
lines by `hh:mm`, loopback ports by `<port>`.
Regenerate with `UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/shim` (the whole
directory: the file is rewritten from the cases that ran) and review the diff.
"""

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_LOCAL_TIME = re.compile(r"\b[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2} [+-]\d{2}:\d{2}")
_MESSAGE_CLOCK = re.compile(r"\[#(\d+) (?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}\]")
_PORT = re.compile(r"127\.0\.0\.1:\d+")


class Normaliser:
    """Replaces what changes from run to run with stable names."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._anonymous = 0

    def name(self, value: str, name: str) -> None:
        """Show `value` (an id) as `<name>`."""
        self._names[value] = f"<{name}>"

    def __call__(self, text: str) -> str:
        text = _UUID.sub(self._replace_id, text)
        text = _LOCAL_TIME.sub("<local time>", text)
        text = _MESSAGE_CLOCK.sub(lambda match: f"[#{match.group(1)} hh:mm]", text)
        return _PORT.sub("127.0.0.1:<port>", text)

    def _replace_id(self, match: re.Match[str]) -> str:
        value = match.group(0)
        if value not in self._names:
            self._anonymous += 1
            self._names[value] = f"<id-{self._anonymous}>"
        return self._names[value]


class SnapshotFile:
    """The sections of the snapshot file, checked (or, when updating, replaced) by name."""

    def __init__(self, path: Path = SNAPSHOT_FILE) -> None:
        self.path = path
        self.update = os.environ.get("UPDATE_SNAPSHOTS") == "1"
        self.sections = _parse(path.read_text(encoding="utf-8")) if path.exists() else {}
        self.visited: dict[str, str] = {}

    def check(self, name: str, text: str) -> None:
        """Assert `text` is the stored section `name` (store it when updating)."""
        if self.update:
            self.visited[name] = text
            return
        assert name in self.sections, (
            f"no snapshot section {name!r} in {self.path}: run UPDATE_SNAPSHOTS=1 "
            ".venv/bin/pytest tests/shim once and review it"
        )
        expected = self.sections[name]
        assert text == expected, (
            f"crew output for {name!r} changed:\n--- expected\n{expected}\n--- got\n{text}"
        )

    def save(self) -> None:
        """Rewrite the file from the sections this run produced (update mode only)."""
        if not (self.update and self.visited):
            return
        parts = [_HEADER]
        for name in sorted(self.visited):
            parts.append(f"## {name}\n\n{FENCE}text\n{self.visited[name]}\n{FENCE}\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(parts), encoding="utf-8")


def _parse(text: str) -> dict[str, str]:
    sections: dict[str, str] = {}
    pattern = re.compile(
        rf"^## (?P<name>.+?)\n\n{FENCE}text\n(?P<body>.*?)\n{FENCE}$", re.MULTILINE | re.DOTALL
    )
    for match in pattern.finditer(text):
        sections[match.group("name")] = match.group("body")
    return sections
