"""Cheaper cold starts (issue 26) keep the network's guarantees.

The firewall's helper is started before there is a namespace for it (or
taken ready from the backend's spare) and handed the sandbox's namespaces
once bwrap's loopback step is done; pasta and the firewall then go in side
by side, and the sandbox is let go only once both are done. `close` kills
pasta and the helper without waiting for their exit. Each test here fails if
one of those steps happens in the wrong place: a helper that entered a
namespace too early, or the host's; a sandbox let go before its firewall; a
spare that never gets used; a killed process left unreaped.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_harness.waiting import wait_until
from sandbox_launcher.engine_run import _descendants
from sandbox_launcher.network import (
    NFT_TABLE,
    NetworkPlan,
    NetworkUnavailable,
    PastaTools,
    SandboxNetwork,
    find_pasta,
)
from sandbox_launcher.nft_helper import NftError, NftHelper, NftSpare
from sandbox_launcher.warm_server import _pid_two_below, _scan_for_pid_two, find_server_pid
from tests.launcher.test_network_start import _child, _map_ids
from tests.support.ci import required_in_ci

BWRAP = "/usr/bin/bwrap"


@pytest.fixture
def pasta(needs_bwrap: None) -> PastaTools:
    tools = find_pasta()
    if tools is None:
        required_in_ci("pasta (Debian package passt)")
    assert tools is not None
    if tools.nftables is None:
        required_in_ci("libnftables (Debian package nftables): the sandbox's firewall")
    return tools


def _net_ns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _helper_pid(helper: NftHelper) -> int:
    return helper._process.pid


def _gone(pid: int) -> bool:
    """Reaped, not only dead: a zombie still has its /proc entry."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def sandbox(pasta: PastaTools) -> Iterator[tuple[SandboxNetwork, subprocess.Popen[bytes], int]]:
    """A networked bwrap held on our pipe before its loopback step; (network, bwrap, hold fd)."""
    spare = NftSpare(sys.executable, str(pasta.nftables))
    spare.refill()
    network = SandboxNetwork(pasta, NetworkPlan(), None, spare)
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
        spare.close()


def test_the_helper_waits_in_no_namespace_until_the_loopback_step_then_enters_the_sandboxs(
    sandbox: tuple[SandboxNetwork, subprocess.Popen[bytes], int],
) -> None:
    """Started ahead, but never in the host's namespace with a context, nor in the sandbox's
    before bwrap is done with it; once attached, the table is in the sandbox's namespace."""
    network, bwrap, hold = sandbox
    helper = network._helper
    assert helper is not None and helper.waiting(), "no helper was started ahead"
    attached: list[BaseException | None] = []

    def attach() -> None:
        try:
            network.attach_blocking()
            attached.append(None)
        except BaseException as exc:  # handed to the test thread
            attached.append(exc)

    thread = threading.Thread(target=attach)
    thread.start()
    child = wait_until("bwrap's child", lambda: _child(bwrap.pid))
    _map_ids(child)
    wait_until("the attach to wait for bwrap's loopback", lambda: "loopback" in network.waiting_for)
    # Held before its loopback step: the helper has been handed nothing yet.
    assert network._helper is helper and helper.waiting()
    assert _net_ns(_helper_pid(helper)) == _net_ns("self")
    os.write(hold, b"x")
    thread.join()
    assert attached == [None], attached
    assert network._nft is helper and not helper.waiting()
    # `bwrap` has exited by now; the helper still holds the namespace, as it should.
    assert _net_ns(_helper_pid(helper)) != _net_ns("self")
    assert NFT_TABLE in helper.run("list tables")
    assert bwrap.wait() == 0, bwrap.stderr.read() if bwrap.stderr else ""


def test_a_root_launchers_table_never_lands_in_the_hosts_namespace(
    sandbox: tuple[SandboxNetwork, subprocess.Popen[bytes], int],
) -> None:
    """As root a mistake would load the table into the host's own netns: look there too."""
    if os.geteuid() != 0:
        pytest.skip("only root could load a table into the host's namespace")
    network, bwrap, hold = sandbox
    child = wait_until("bwrap's child", lambda: _child(bwrap.pid))
    _map_ids(child)
    os.write(hold, b"x")
    network.attach_blocking()
    host = NftHelper.spawn(sys.executable, str(network.tools.nftables))
    try:
        # Our own net namespace, entered again: root may (the same user namespace: none).
        fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        try:
            host.enter((-1, fd))
        finally:
            os.close(fd)
        assert NFT_TABLE not in host.run("list tables")
    finally:
        host.close()


def test_the_spare_is_taken_and_the_next_one_started_at_close(pasta: PastaTools) -> None:
    spare = NftSpare(sys.executable, str(pasta.nftables))
    try:
        spare.refill()
        ready = spare._ready
        assert ready is not None and ready.waiting()
        network = SandboxNetwork(pasta, NetworkPlan(), None, spare)
        assert network._helper is ready and spare._ready is None
        network.close()  # never attached: the helper is killed, the spare refilled
        wait_until("the helper reaped", lambda: _gone(_helper_pid(ready)))
        following = wait_until("the next spare", lambda: spare._ready)
        assert following is not ready and following.waiting()
    finally:
        spare.close()


def test_a_spare_that_died_is_replaced(pasta: PastaTools) -> None:
    spare = NftSpare(sys.executable, str(pasta.nftables))
    try:
        spare.refill()
        dead = spare._ready
        assert dead is not None
        dead.kill()
        wait_until("the spare dead", lambda: dead._process.poll() is not None)
        taken = spare.take()
        try:
            assert taken is not dead and taken.waiting()
        finally:
            taken.close()
    finally:
        spare.close()


def test_a_broken_library_through_the_spare_fails_the_attach(
    pasta: PastaTools, tmp_path: Path
) -> None:
    """The spare loads libnftables ahead: its failure must surface at the attach, closed."""
    broken = tmp_path / "libnftables.so.1"
    broken.write_text("not a library\n")
    tools = dataclasses.replace(pasta, nftables=str(broken))
    spare = NftSpare(sys.executable, str(broken))
    spare.refill()
    network = SandboxNetwork(tools, NetworkPlan(), None, spare)
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
        spare.close()


def test_enter_twice_is_refused(pasta: PastaTools) -> None:
    helper = NftHelper.spawn(sys.executable, str(pasta.nftables))
    try:
        helper.close()
        with pytest.raises(NftError):
            helper.enter((-1, 0))
    finally:
        helper.close()


def test_close_reaps_pasta_and_the_helper_without_waiting_for_them(pasta: PastaTools) -> None:
    network = SandboxNetwork(pasta, NetworkPlan())
    argv = [BWRAP, "--unshare-user", "--ro-bind", "/", "/", "--chdir", "/", "true"]
    bwrap = subprocess.Popen(network.argv(argv), pass_fds=network.pass_fds)
    network.spawned()
    network.attach_blocking()
    assert bwrap.wait() == 0
    pasta_pid, helper = network.pasta_pid, network._nft
    assert pasta_pid is not None and helper is not None
    network.close()
    wait_until("pasta reaped", lambda: _gone(pasta_pid))
    wait_until("the helper reaped", lambda: _gone(_helper_pid(helper)))


def test_the_server_pid_is_found_among_the_descendants_as_in_the_whole_of_proc(
    needs_bwrap: None,
) -> None:
    """The short walk (`_pid_two_below`) and the full scan agree on a real pid namespace."""
    argv = [BWRAP, "--unshare-pid", "--unshare-user", "--ro-bind", "/", "/", "--dev", "/dev"]
    argv += ["--proc", "/proc", "sh", "-c", "sleep 60 & wait"]
    bwrap = subprocess.Popen(argv, start_new_session=True)
    try:
        found = wait_until("the namespace's pid 2", lambda: _scan_for_pid_two(bwrap.pid))
        assert _pid_two_below(bwrap.pid) == found
        assert find_server_pid(bwrap.pid) == found
        assert _pid_two_below(os.getpid(), depth=1) is None  # none among our own children
    finally:
        os.killpg(bwrap.pid, 9)
        bwrap.wait()


def test_descendants_hold_a_grandchild_and_a_group_is_seen_through_them(needs_bwrap: None) -> None:
    """A subreaper launcher looks for a run's leftovers among its descendants only."""
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE)
    try:
        assert leader.stdout is not None
        grandchild = int(leader.stdout.readline())
        found = _descendants(os.getpid())
        assert found is not None and leader.pid in found and grandchild in found
        assert os.getpid() not in found
    finally:
        leader.kill()
        leader.wait()
        os.kill(grandchild, 9)
