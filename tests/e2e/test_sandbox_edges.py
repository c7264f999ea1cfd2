"""Issue 20 items 2 and 6b through the real OpenCode and launcher, cold and warm.

A bash tool (1) sends to a host Unix datagram socket (a stand-in for
journald's, made by the test in /var/tmp) from a `socketpair(AF_UNIX,
SOCK_DGRAM)` end: the host socket must receive nothing, while a stream pair
still works; (2) writes `/tmp/a` and reads it back, with `$HOME` and the
crew home below the host's /tmp (as the test's HOME is): the hybrid sandbox
used to refuse the read ("Permission denied").
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_harness.scripted_model import Script, ScriptedModel
from crew_testkit.engine_rig import EngineRig
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

PROBE = (
    "import socket, sys\n"
    "out = []\n"
    "try:\n"
    "    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "    a.sendto(b'from-the-sandbox', sys.argv[1])\n"
    "    out.append('dgram-sent')\n"
    "except OSError as exc:\n"
    "    out.append(f'dgram-denied-{exc.errno}')\n"
    "a, b = socket.socketpair()\n"
    "a.send(b'ping')\n"
    "out.append('stream-' + b.recv(4).decode())\n"
    "print(' '.join(out))\n"
)


@pytest.fixture
def listener() -> Iterator[tuple[Path, socket.socket]]:
    directory = Path(tempfile.mkdtemp(prefix="crew-e2e-dgram-", dir="/var/tmp"))
    directory.chmod(0o755)
    path = directory / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    os.chmod(path, 0o777)
    sock.setblocking(False)
    try:
        yield path, sock
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


def _received(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(64))
        except BlockingIOError:
            return got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["cold", "warm"])
async def test_no_host_datagram_socket_and_a_readable_private_tmp(
    kind: str, listener: tuple[Path, socket.socket]
) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    path, sock = listener
    assert str(Path(os.environ["HOME"])).startswith("/tmp/")  # the case of item 6b
    probe = PROBE.replace("'", "'\"'\"'")
    bash = (
        f"python3 -c '{probe}' {path} > socket.out 2>&1; "
        "echo tmp-ok > /tmp/a && cat /tmp/a > tmp.out 2>&1; echo done"
    )
    script = {"rules": [{"match": "EDGES", "reply": {"bash": bash}}]}
    with ScriptedModel(Script.parse(script)) as model:
        async with EngineRig(model, OPENCODE) as rig:
            home = rig.agent(f"{kind}edges")
            turn = await rig.turn(kind, f"{kind}edges", "EDGES")
            assert turn.result.status == "succeeded", turn.result.failure
            work = home.paths.agent_dir / "work"
            assert (work / "socket.out").read_text().split() == ["dgram-denied-1", "stream-ping"]
            assert _received(sock) == []
            assert (work / "tmp.out").read_text() == "tmp-ok\n"
