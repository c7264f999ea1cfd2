"""A root Computer's engines run as the engine user, never as uid 0 (issue 20, R21/R22).

The real Computer, server, launcher (bwrap) and the fake engine, cold and warm,
in both Linux modes. The agent's tool reads `/etc/shadow` and a 0600 file in a
0700 directory of root's (denied by ownership alone: both lie outside every
deny root), and does its work: writes `work/`, commits with git, replies with
`crew` (its token file and the run's `bin/` handed over). As an ordinary
caller the engine keeps the caller's uid, and the same reads fail the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_common.engine_user import engine_identity
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.support.ci import required_in_ci
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)

# One line (the fake engine runs what follows `FAKE:RUN` on its line with /bin/sh -c).
PROBE = [
    'echo "uid $(id -u)" > probe.txt',
    'cat /etc/shadow >/dev/null 2>&1; echo "shadow $?" >> probe.txt',
    'cat ROOT_ONLY >/dev/null 2>&1; echo "root_only $?" >> probe.txt',
    'ls ROOT_DIR >/dev/null 2>&1; echo "root_only_dir $?" >> probe.txt',
    "echo caps $(grep -c '^Cap[A-Za-z]*:.0000000000000000$' /proc/self/status) >> probe.txt",
    'echo work > mine.txt; echo "write_work $?" >> probe.txt',
    "git init -q repo && cd repo && echo a > a && git add a"
    " && git -c user.email=a@b -c user.name=a commit -qm x >/dev/null 2>&1;"
    ' echo "git $?" >> ../probe.txt; cd ..',
    "echo done | crew reply ROOM",
]


@pytest.fixture
def root_only() -> Iterator[Path]:
    """A 0700 directory of the caller's (root in CI) with a 0600 file in it, outside $HOME."""
    folder = Path(tempfile.mkdtemp(prefix="crew-root-only-", dir="/var/tmp"))
    (folder / "secret").write_text("ROOT-ONLY\n")
    (folder / "secret").chmod(0o600)
    try:
        yield folder / "secret"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("engine", ["cold", "warm"])
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_engine_is_never_root_and_its_work_goes_on(
    crew_server: Any, mode: str, engine: str, root_only: Path
) -> None:
    need_sandbox()
    expected_uid = os.getuid()
    if os.getuid() == 0:
        identity = engine_identity()
        if identity is None:
            required_in_ci("the crew-engine system user (scripts/setup creates it)")
        assert identity is not None
        expected_uid = identity.uid
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent(f"uid{mode}{engine}", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        bootstrap = bootstrap_for(
            crew_server.url, comp["token"], m, sandbox_mode=mode, engine_mode=engine
        )
        c = launch(m, bootstrap)
        try:
            usable(c)
            script = "; ".join(PROBE).replace("ROOT_ONLY", str(root_only))
            script = script.replace("ROOT_DIR", str(root_only.parent)).replace("ROOM", dm["id"])
            crew_server.post(dm["id"], f"probe\nFAKE:RUN {script}")
            [turn] = finished(crew_server, agent["id"], 1, timeout=60)
            work = m.crew_home / "agents" / agent["id"] / "work"
            lines = dict(
                line.split(" ", 1) for line in (work / "probe.txt").read_text().splitlines()
            )
            mine = (work / "mine.txt").read_text()
        finally:
            c.stop()
    assert lines["uid"] == str(expected_uid), lines
    assert lines["shadow"] != "0", f"R21: /etc/shadow was readable: {lines}"
    if os.getuid() == 0:
        assert lines["root_only"] != "0", f"R22: a 0600 file of root's was readable: {lines}"
        assert lines["root_only_dir"] != "0", f"R22: a 0700 dir of root's was listed: {lines}"
    assert lines["caps"] == "5", lines  # CapInh, CapPrm, CapEff, CapBnd, CapAmb
    # positive controls: the agent's work
    assert lines["write_work"] == "0" and mine == "work\n"
    assert lines["git"] == "0", lines
    assert turn["status"] == "succeeded", turn
    replies = [msg for msg in crew_server.messages(dm["id"]) if msg.get("body") == "done"]
    assert replies, "the agent's crew reply did not arrive"
