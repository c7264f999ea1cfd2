"""`crew-computer` / `python -m computer_service`: read the bootstrap, run the Computer.

Exit status: 0 after an orderly stop (stdin closed, SIGTERM, SIGINT); 1 when
the bootstrap is bad, the server refuses the connection, this run cannot be
prepared, or it cannot go on (`opencode models` gives no list, the server
refuses the model list or the event stream) — after an orderly stop, with a
one-line reason on stderr (never the token).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import anyio

from computer_service.bootstrap import MAX_BOOTSTRAP_BYTES, BootstrapError, parse_bootstrap
from computer_service.parts_protocol import StartupFailed
from computer_service.service import ComputerService


def read_bootstrap_line(fd: int) -> bytes:
    """Read stdin up to the first newline, unbuffered: the rest of stdin stays ours to watch."""
    data = b""
    while b"\n" not in data and len(data) <= MAX_BOOTSTRAP_BYTES:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def main() -> None:
    """The console script: exits 0 after an orderly stop, 1 with a reason otherwise."""
    logging.basicConfig(
        level=os.environ.get("CREW_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        bootstrap = parse_bootstrap(read_bootstrap_line(sys.stdin.fileno()))
    except (BootstrapError, OSError) as exc:
        _fail(str(exc))
    # Imported here: the engine side is only needed once the bootstrap is valid.
    from computer_service.parts import LocalParts

    parts = LocalParts(bootstrap)
    service = ComputerService(
        bootstrap, parts, stdout=sys.stdout.buffer, stdin_fd=sys.stdin.fileno()
    )
    try:
        code = anyio.run(service.serve)
    except StartupFailed as exc:
        _fail(str(exc))
    sys.exit(code)


def _fail(reason: str) -> NoReturn:
    sys.stderr.write(f"crew-computer: {reason.splitlines()[0] if reason else 'failed'}\n")
    sys.stderr.flush()
    sys.exit(1)


if __name__ == "__main__":
    main()
