"""Choosing the platform backend at start: bwrap (Linux) or Seatbelt (macOS).

`open_backend` finds the tools, runs the preflight and picks the Linux mode;
the self-test (`sandbox_launcher.selftest`) then proves the chosen backend
really enforces the policy. Either step failing gives a `SandboxHealth` with
`ok: false` and a reason a user can act on; runs are then refused (503).
Nothing ever runs unsandboxed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from crew_common.egress import EgressPolicy
from crew_common.engine_user import EngineIdentity, EngineUserMissing, engine_identity
from crew_common.launcher_wire import SandboxHealth
from sandbox_launcher import landlock
from sandbox_launcher.bwrap import (
    SETPRIV_CANDIDATES,
    BwrapTools,
    LinuxMode,
    SandboxUnavailable,
    bwrap_argv,
    choose_mode,
    find_program,
    find_tools,
    preflight,
    reachable_needed,
    unreachable_levels,
)
from sandbox_launcher.limits import DISK_NOTE, MIB, TurnLimits
from sandbox_launcher.mounts import alias_masks
from sandbox_launcher.network import (
    NO_FIREWALL_NOTE,
    NetworkPlan,
    PastaTools,
    SandboxNetwork,
    egress_refusal,
    find_pasta,
    missing_reason,
    sandbox_resolver,
)
from sandbox_launcher.nft_helper import NftSpare
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.seatbelt import SANDBOX_EXEC, seatbelt_argv, seatbelt_egress_refusal
from sandbox_launcher.tool_shell import (
    NATIVE_DIR_NAME,
    NATIVE_NAME,
    build_native_tool_shell,
    native_tool_shell,
    system_programs,
    write_tool_shells,
)

log = logging.getLogger(__name__)

TMPFS_NOTE = (
    "tmpfs mode: files in $HOME outside the allowlist are hidden entirely "
    "(stat and ls cannot see them either)"
)


NO_TOOL_DOMAIN_NOTE = (
    "no Landlock in this kernel (Linux 5.13+ has it): an agent's tools share the engine's "
    "domain and could rewrite the engine process through /proc (docs/warm-engine.md)"
)


NO_RG_NOTE = (
    "ripgrep (rg) is not installed: OpenCode's grep and glob tools fail with that reason "
    "(install it: apt-get install ripgrep; an rg in an agent's own directories is never used)"
)


SLOW_TOOL_SHELL_NOTE = (
    "the native tool shell is not built (scripts/setup builds it with gcc, an installed "
    "launcher at its start with the system's cc): each tool call "
    "starts the Python one instead, tens of milliseconds more (sandbox_launcher/tool_shell.py)"
)


def with_tool_shells(
    tools: BwrapTools, base: Path, native: Path | Literal["built"] | None = "built"
) -> BwrapTools:
    """`tools` with the tool shells written below `base` and made readable in every sandbox.

    `native`: the native helper ("built": the one scripts/setup built, else one this
    launcher builds below `base` from the packaged source; None: the Python helper, asked
    for). When "built" finds none the Python helper runs, said in the health
    (`SLOW_TOOL_SHELL_NOTE`) — but never in CI, where it must have been built.
    """
    if native == "built":
        native = native_tool_shell() or build_native_tool_shell(base / NATIVE_DIR_NAME)
        if native is None:
            if os.environ.get("CI") == "true":
                raise SandboxUnavailable(
                    "the native tool shell is not built (CI=true allows no fallback): "
                    "run scripts/setup with gcc installed (apt-get install gcc libc6-dev)"
                )
            log.warning("%s", SLOW_TOOL_SHELL_NOTE)
    try:
        shells = write_tool_shells(base, tools.python, tools.helper, native=native)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot write the tool shell below {base}: {exc}") from exc
    return dataclasses.replace(tools, tool_shells=shells)


class Backend(Protocol):
    """Turns a policy and a command into the argv that runs it sandboxed."""

    @property
    def name(self) -> Literal["bwrap", "seatbelt"]: ...

    @property
    def mode(self) -> Literal["hybrid", "tmpfs"] | None: ...

    def argv(
        self, policy: SandboxPolicy, command: list[str], plan: NetworkPlan | None = None
    ) -> list[str]:
        """The sandboxed argv; `plan` is the run's network (None: the self-test's, open)."""
        ...

    def egress_refusal(self, egress: EgressPolicy) -> str | None:
        """Why a sandbox with `egress` cannot be given it here (fail closed), or None."""
        ...

    @property
    def engine_ids(self) -> tuple[int, int] | None:
        """The (uid, gid) engines run as when it is not the launcher's own (a root launcher)."""
        ...

    def network(self, plan: NetworkPlan) -> SandboxNetwork | None:
        """The sandbox's own network for one run; None: it shares the host's."""
        ...


@dataclass(frozen=True)
class BwrapBackend:
    """Linux: bubblewrap, with Landlock inside in hybrid mode."""

    tools: BwrapTools
    linux_mode: LinuxMode
    pasta: PastaTools | None = None  # None only in tests of the argv alone
    name: Literal["bwrap", "seatbelt"] = "bwrap"
    # The next sandbox's firewall helper, started ahead (network.py: cold start).
    spare: NftSpare | None = field(default=None, compare=False, repr=False)

    @property
    def mode(self) -> Literal["hybrid", "tmpfs"]:
        return "hybrid" if self.linux_mode is LinuxMode.HYBRID else "tmpfs"

    @property
    def engine_ids(self) -> tuple[int, int] | None:
        return self.tools.engine_ids

    def argv(
        self, policy: SandboxPolicy, command: list[str], plan: NetworkPlan | None = None
    ) -> list[str]:
        # The network is pasta's and the firewall's (`network`), not bwrap's: `plan` unused.
        # Mounts change while the launcher runs: aliases are looked up per run.
        aliases = alias_masks(policy.deny_roots)
        ids = self.tools.engine_ids
        unreachable = unreachable_levels(reachable_needed(policy, self.tools), ids) if ids else ()
        return bwrap_argv(policy, self.linux_mode, self.tools, command, aliases, unreachable)

    def egress_refusal(self, egress: EgressPolicy) -> str | None:
        return egress_refusal(self.pasta, egress) if self.pasta is not None else None

    def network(self, plan: NetworkPlan) -> SandboxNetwork | None:
        # open_backend never makes one without pasta: no run shares the host's network.
        if self.pasta is None:
            return None
        # Looked up per run: the host's resolver changes with its network.
        return SandboxNetwork(self.pasta, plan, sandbox_resolver(), self.spare)


@dataclass(frozen=True)
class SeatbeltBackend:
    """macOS: sandbox-exec with the parameterised profile."""

    name: Literal["bwrap", "seatbelt"] = "seatbelt"
    mode: Literal["hybrid", "tmpfs"] | None = None
    engine_ids: tuple[int, int] | None = None  # macOS: engines keep the caller's uid

    def argv(
        self, policy: SandboxPolicy, command: list[str], plan: NetworkPlan | None = None
    ) -> list[str]:
        if plan is None:
            return seatbelt_argv(policy, command)
        return seatbelt_argv(policy, command, plan.egress.mode, plan.loopback_ports)

    def egress_refusal(self, egress: EgressPolicy) -> str | None:
        return seatbelt_egress_refusal(egress)

    def network(self, plan: NetworkPlan) -> SandboxNetwork | None:
        return None  # Seatbelt has no network namespaces: the host's network (README)


def open_backend(
    requested: LinuxMode | None,
    limits: TurnLimits | None = None,
    tool_shell_base: Path | None = None,
) -> tuple[Backend | None, SandboxHealth]:
    """Find and preflight this platform's backend. The health is not final: the self-test follows.

    `limits`: the per-run process cap (RLIMIT_NPROC) and `/dev/shm` size go into bwrap's argv.
    `tool_shell_base`: a directory of the caller's where the tool shells are written
    (`sandbox_launcher.tool_shell`); None leaves the sandboxes without `$SHELL`.
    """
    if sys.platform == "darwin":
        if not os.access(SANDBOX_EXEC, os.X_OK):
            return None, SandboxHealth(
                ok=False, backend="seatbelt", reason=f"{SANDBOX_EXEC} not found or not executable"
            )
        return SeatbeltBackend(), SandboxHealth(ok=True, backend="seatbelt", network="shared")
    if not sys.platform.startswith("linux"):
        return None, SandboxHealth(
            ok=False, backend="bwrap", reason=f"no sandbox backend for platform {sys.platform}"
        )
    try:
        tools = find_tools()
        limits = limits or TurnLimits()
        tools = dataclasses.replace(
            tools,
            nproc=limits.max_processes,
            shm_bytes=limits.shm_bytes,
            fsize=limits.disk_bytes,
        )
        engine_user = _engine_user()
        if engine_user is not None:
            setpriv = find_program(SETPRIV_CANDIDATES, "setpriv", "install util-linux")
            ids = (engine_user.uid, engine_user.gid)
            tools = dataclasses.replace(tools, engine_ids=ids, setpriv=setpriv)
        reason = preflight(tools)
        if reason is not None:
            raise SandboxUnavailable(reason)
        abi = landlock.abi()
        mode = choose_mode(requested, abi)
        if tool_shell_base is not None and abi > 0:
            tools = with_tool_shells(tools, tool_shell_base)
        # Without its own network namespace an agent could squat the crew server's
        # port and receive the Computer's token: refuse rather than run (README).
        pasta = find_pasta()
        if pasta is None:
            raise SandboxUnavailable(missing_reason())
    except SandboxUnavailable as exc:
        return None, SandboxHealth(ok=False, backend="bwrap", reason=str(exc))
    spare = NftSpare(sys.executable, pasta.nftables) if pasta.nftables is not None else None
    backend = BwrapBackend(tools, mode, pasta, spare=spare)
    no_rg = tools.tool_shells is not None and system_programs()["rg"] is None
    slow_shell = tools.tool_shells is not None and not (tools.tool_shells / NATIVE_NAME).exists()
    return backend, SandboxHealth(
        ok=True,
        backend="bwrap",
        mode=backend.mode,
        reason=health_note(
            mode,
            abi,
            engine_user,
            limits,
            no_rg=no_rg,
            firewall=pasta.nftables is not None,
            slow_tool_shell=slow_shell,
        ),
        network="namespace",
    )


def _engine_user() -> EngineIdentity | None:
    try:
        return engine_identity()
    except EngineUserMissing as exc:
        raise SandboxUnavailable(str(exc)) from exc


def health_note(
    mode: LinuxMode,
    abi: int,
    engine_user: EngineIdentity | None = None,
    limits: TurnLimits | None = None,
    *,
    no_rg: bool = False,
    firewall: bool = True,
    slow_tool_shell: bool = False,
) -> str | None:
    """What a working Linux sandbox does not do here: tmpfs hides more, no Landlock nests
    tools, no ripgrep for the engine (`tool_shell.ENGINE_PROGRAMS`), no native tool shell
    (`tool_shell.native_tool_shell`); and as root, which
    user engines run as; no firewall in its network (no libnftables: host addresses
    reachable, no connection cap)."""
    notes = [TMPFS_NOTE] if mode is LinuxMode.TMPFS else []
    if abi == 0:
        notes.append(NO_TOOL_DOMAIN_NOTE)
    if not firewall:
        notes.append(NO_FIREWALL_NOTE)
    if no_rg:
        notes.append(NO_RG_NOTE)
    if slow_tool_shell:
        notes.append(SLOW_TOOL_SHELL_NOTE)
    if engine_user is not None:
        notes.append(
            f"the launcher runs as root: engines run as the system user {engine_user.name} "
            f"(uid {engine_user.uid}), which owns the agents' directories"
        )
    if limits is not None:
        notes.append(DISK_NOTE.format(mib=limits.disk_bytes // MIB))
    return "; ".join(notes) or None
