"""A hostile engine inside the real sandbox: every forbidden thing is denied, the allowed ones work.

Runs through `POST /runs` of a real launcher (real bwrap), in both Linux
modes, with $HOME below /tmp (the test default, where the private /tmp must
bind things back) and outside it (/var/tmp, like a real /home).
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from tests.launcher.helpers import (
    LauncherProcess,
    engine_lines,
    make_layout,
    processes_with,
    write_fake_opencode,
)

SSH_KEY = "-----BEGIN FAKE KEY-----\n"
SECRET = "TOP-SECRET-VALUE\n"
BASHRC = "# the user's own bashrc\n"


@pytest.fixture(params=["home_in_tmp", "home_in_var_tmp"])
def hostile_home(request: pytest.FixtureRequest, isolated_home: Path) -> Iterator[Path]:
    if request.param == "home_in_tmp":
        yield isolated_home
        return
    home = Path(tempfile.mkdtemp(prefix="crew-hostile-home-", dir="/var/tmp"))
    os.environ["HOME"] = str(home)  # the suite fixture restores it afterwards
    os.environ["CREW_HOME"] = str(home / ".crew")
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _plant_secrets(home: Path) -> None:
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_rsa").write_text(SSH_KEY)
    (home / "secret").write_text(SECRET)
    (home / ".bashrc").write_text(BASHRC)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_hostile_engine_is_contained(
    mode: str, needs_bwrap: None, hostile_home: Path, tmp_path: Path
) -> None:
    home = hostile_home
    _plant_secrets(home)
    layout = make_layout(home)
    layout.add_agent("alice")
    layout.add_agent("bob")
    opencode = write_fake_opencode(tmp_path / "engine-bin")
    computer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    computer_sock = layout.crew_home / "sockets" / "computer.sock"
    computer.bind(str(computer_sock))
    computer.listen(1)
    marker = f"{300 + random.random():.6f}"
    tag = uuid.uuid4().hex[:8]
    var_tmp_file = Path(f"/var/tmp/crew-hostile-{tag}")
    etc_file = Path(f"/etc/crew-hostile-{tag}")
    launcher = LauncherProcess(layout, opencode, mode=mode)
    try:
        script = {
            "scenario": "hostile",
            "home": str(home),
            "marker": marker,
            "var_tmp_file": str(var_tmp_file),
            "etc_file": str(etc_file),
            "other_token": str(layout.runtime_dir("bob") / "token"),
            "own_token": str(layout.runtime_dir("alice") / "token"),
            "computer_sock": str(computer_sock),
            "launcher_pid": launcher.pid,
            "agent_dir": str(layout.agent_dir("alice")),
            "runtime_dir": str(layout.runtime_dir("alice")),
            "bin_crew": str(layout.bin_dir / "crew"),
        }
        frames = launcher.run(layout.run_request("alice", script))
        results = {r["check"]: r for r in engine_lines(frames) if "check" in r}
        assert "done" in results, frames
        assert frames[-1]["t"] == "exit" and frames[-1]["code"] == 0, frames[-1]

        def denied(name: str, *errnos: int) -> None:
            r = results[name]
            assert not r["worked"], f"{name} was NOT denied: {r}"
            if errnos:
                assert r["errno"] in errnos, f"{name}: unexpected error {r}"

        def worked(name: str) -> dict[str, Any]:
            r = results[name]
            assert r["worked"], f"{name} should work: {r}"
            return r

        hidden = (errno.EACCES, errno.ENOENT)
        denied("read_ssh_key", *hidden)
        denied("read_secret", *hidden)
        if mode == "hybrid" and os.getuid() != 0 and not str(home).startswith("/tmp/"):
            # Landlock leaves metadata alone: existence checks still work. (As root the
            # engine user could not search a 0700 $HOME, and a $HOME below /tmp lies under
            # the private /tmp: both hidden as in tmpfs mode, issue 20.)
            assert worked("stat_ssh_key")["result"] == repr(len(SSH_KEY))
            assert worked("stat_secret")["result"] == repr(len(SECRET))
        else:
            denied("stat_ssh_key", errno.ENOENT)
            denied("stat_secret", errno.ENOENT)
        denied("write_bashrc", errno.EROFS, errno.EACCES)
        denied("write_var_tmp", errno.EROFS, errno.EACCES)
        denied("write_etc", errno.EROFS, errno.EACCES)
        denied("read_other_token", *hidden)
        assert "token-of-alice" in worked("read_own_token")["result"]
        denied("connect_computer_socket", errno.EPERM)  # seccomp: no socket(AF_UNIX)
        denied("read_launcher_environ", errno.ENOENT, errno.ESRCH, errno.EACCES)
        denied("signal_launcher", errno.ESRCH, errno.EPERM)
        for name in ("write_agent_dir", "write_runtime_dir", "write_tmpdir", "write_slash_tmp"):
            worked(name)
        assert "crew-wrapper" in worked("read_bin_crew")["result"]
        assert "heredoc-ok" in worked("zsh_heredoc")["result"]
        # stdin, stdout, stderr and listdir's own: no launcher socket leaks in
        assert worked("inherited_fds")["result"] == repr([0, 1, 2, 3])
        assert "moved" in worked("rename_agent_dir")["result"]
        assert "moved" in worked("rename_tmpdir")["result"]

        # On the host: nothing escaped, the launcher lives, nothing was left running.
        assert (home / ".bashrc").read_text() == BASHRC
        assert not var_tmp_file.exists() and not etc_file.exists()
        assert launcher.proc.poll() is None
        with launcher.client() as client:
            assert client.get("/health").json()["sandbox"]["ok"] is True
        private_tmp = layout.runtime_dir("alice") / "tmp" / "probe-slash-tmp.txt"
        assert private_tmp.exists(), "the sandbox's /tmp must be the agent's own temp dir"
        assert not Path("/tmp/probe-slash-tmp.txt").exists()
        assert (layout.agent_dir("alice") / "probe.txt").read_text() == "a\n"
        wait_until("the run's background processes to end", lambda: not processes_with(marker), 3)
    finally:
        launcher.stop()
        computer.close()
        var_tmp_file.unlink(missing_ok=True)
        etc_file.unlink(missing_ok=True)
