"""A sandbox's network comes up whatever the order its processes run in, or says why not.

bwrap's child gives its loopback 127.0.0.1 itself, with NLM_F_EXCL, and dies
when the address is already there ("loopback: Failed RTM_NEWADDR"); pasta
brings `lo` up, which gives it that address. On a loaded machine the child
can wait for the CPU until pasta got there first: the run then failed with
`[Errno 2] No such file or directory: '/proc/<pid>/ns/net'` (a pasta started
again for a sandbox already gone). Here the child is held at that point on
purpose (bwrap's `--userns-block-fd`, which also holds its uid map), so the
order is not left to the scheduler.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from crew_harness.waiting import wait_until
from sandbox_launcher.engine_run import EngineRun
from sandbox_launcher.network import (
    NetworkPlan,
    NetworkUnavailable,
    PastaTools,
    SandboxNetwork,
    find_pasta,
    has_default_route,
)
from sandbox_launcher.warm_server import ServerFailed, WarmServer
from tests.support.ci import required_in_ci

BWRAP = "/usr/bin/bwrap"


@pytest.fixture
def pasta(needs_bwrap: None) -> PastaTools:
    tools = find_pasta()
    if tools is None:
        required_in_ci("pasta (Debian package passt)")
    assert tools is not None
    return tools


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _child(bwrap_pid: int) -> int | None:
    """bwrap's child: the sandbox's process, which pasta is attached to."""
    children = _read(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").split()
    return int(children[0]) if children else None


def _map_ids(pid: int) -> None:
    """Write the held child's uid and gid maps (bwrap leaves them to us with --userns-block-fd)."""
    uid, gid = os.getuid(), os.getgid()
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


@pytest.fixture
def held_sandbox(
    pasta: PastaTools,
) -> Iterator[tuple[SandboxNetwork, subprocess.Popen[bytes], int]]:
    """bwrap whose child waits on our pipe before its loopback step; (network, bwrap, hold fd)."""
    network = SandboxNetwork(pasta, NetworkPlan())
    hold_r, hold_w = os.pipe()
    argv = [BWRAP, "--unshare-user", "--userns-block-fd", str(hold_r)]
    argv += ["--ro-bind", "/", "/", "--chdir", "/", "true"]
    bwrap = subprocess.Popen(
        network.argv(argv), pass_fds=(*network.pass_fds, hold_r), stderr=subprocess.PIPE
    )
    os.close(hold_r)
    network.spawned()
    try:
        yield network, bwrap, hold_w
    finally:
        os.close(hold_w)
        bwrap.kill()
        bwrap.wait()
        network.close()


@pytest.mark.parametrize("how", ["async", "blocking"])
def test_pasta_goes_in_only_after_bwraps_loopback_step(
    held_sandbox: tuple[SandboxNetwork, subprocess.Popen[bytes], int], how: str
) -> None:
    """The launcher's runs attach with `attach`, the self-test and `sandbox` with `attach_blocking`."""
    network, bwrap, hold = held_sandbox
    attached: list[BaseException | None] = []

    def attach() -> None:
        try:
            if how == "async":
                anyio.run(network.attach)
            else:
                network.attach_blocking()
            attached.append(None)
        except BaseException as exc:  # handed to the test thread
            attached.append(exc)

    thread = threading.Thread(target=attach)
    thread.start()
    child = wait_until("bwrap's child", lambda: _child(bwrap.pid))
    _map_ids(child)
    # Held, the child has not touched its loopback. Either the attach waits for that
    # step, or (the bug) pasta went in already: it configured the namespace, or failed.
    wait_until(
        "the attach to wait for bwrap, or pasta to be done with the namespace",
        lambda: (
            "loopback" in network.waiting_for
            or has_default_route(_read(f"/proc/{child}/net/route"))
            or attached
        ),
    )
    os.write(hold, b"x")
    thread.join()
    assert attached == [None], attached
    assert bwrap.wait() == 0, bwrap.stderr.read() if bwrap.stderr else ""


@pytest.mark.anyio
async def test_a_sandbox_that_dies_before_its_network_says_what_bwrap_said(
    pasta: PastaTools, tmp_path: Path
) -> None:
    """Not `[Errno 2] … /proc/<pid>/ns/net`: bwrap's status and its own error line."""
    missing = tmp_path / "not-there"
    argv = [BWRAP, "--unshare-user", "--ro-bind", "/", "/", "--ro-bind", str(missing), "/mnt"]
    argv += ["--chdir", "/", "true"]
    run = EngineRun(
        "r1",
        "a1",
        argv,
        {"PATH": "/usr/bin:/bin"},
        b"",
        1 << 20,
        network=SandboxNetwork(pasta, NetworkPlan()),
    )

    async def emit(data: bytes) -> None:
        raise AssertionError(f"the run started: {data!r}")

    with pytest.raises(NetworkUnavailable) as caught:
        await run.execute(emit)
    message = str(caught.value)
    assert "ended" in message, message
    assert "bwrap exited with status 1" in message, message
    assert f"Can't find source path {missing}" in message, message
    assert "/proc/" not in message, message


def test_bwrap_that_never_starts_its_sandbox_is_told_apart(pasta: PastaTools) -> None:
    """bwrap refusing its options writes no pid at all: the attach says so at once."""
    network = SandboxNetwork(pasta, NetworkPlan())
    bwrap = subprocess.Popen(
        network.argv([BWRAP, "--no-such-option", "true"]),
        pass_fds=network.pass_fds,
        stderr=subprocess.PIPE,
    )
    network.spawned()
    try:
        with pytest.raises(NetworkUnavailable, match="bwrap ended before it started the sandbox"):
            network.attach_blocking()
    finally:
        bwrap.wait()
        network.close()


@pytest.mark.anyio
async def test_a_warm_server_whose_sandbox_dies_says_what_bwrap_said(
    pasta: PastaTools, tmp_path: Path
) -> None:
    missing = tmp_path / "not-there"
    argv = [BWRAP, "--unshare-user", "--ro-bind", "/", "/", "--ro-bind", str(missing), "/mnt"]
    argv += ["--chdir", "/", "true"]
    server = WarmServer("a1", argv, {"PATH": "/usr/bin:/bin"}, SandboxNetwork(pasta, NetworkPlan()))
    with pytest.raises(ServerFailed) as caught:
        await server.start()
    message = str(caught.value)
    assert "bwrap exited with status 1" in message, message
    assert f"Can't find source path {missing}" in message, message


def test_a_firewall_that_cannot_be_set_fails_the_attach(pasta: PastaTools, tmp_path: Path) -> None:
    """libnftables found but unusable: no sandbox goes on without its firewall (nor the self-test)."""
    broken = tmp_path / "libnftables.so.1"
    broken.write_text("not a library\n")
    network = SandboxNetwork(dataclasses.replace(pasta, nftables=str(broken)), NetworkPlan())
    argv = [BWRAP, "--unshare-user", "--ro-bind", "/", "/", "--chdir", "/", "true"]
    bwrap = subprocess.Popen(network.argv(argv), pass_fds=network.pass_fds)
    network.spawned()
    try:
        with pytest.raises(NetworkUnavailable, match="firewall \\(nftables\\) could not be set"):
            network.attach_blocking()
    finally:
        bwrap.kill()
        bwrap.wait()
        network.close()
