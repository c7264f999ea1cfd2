"""macOS backend: Seatbelt (`sandbox-exec`) with a profile that names paths only as params.

The profile is the data file `seatbelt_base.sbpl`; code only computes the
`-D NAME=value` parameters and one `(subpath (param "READ_DIR_<i>"))` /
`(literal (param "READ_FILE_<i>"))` line per allowlist entry. No path text is
ever spliced into the profile, so quotes, parentheses or newlines in a path
cannot change the policy (a property test checks this).

The network (issue 23): Seatbelt's `remote ip` filter knows `localhost` or
`*` as a host, and a port; it cannot tell a LAN address from a public one.
So of the egress modes it enforces `open` (the host's network) and `none`
(IP only to the run's forwarded ports on localhost: the crew server and the
model gateway; ports are integers, the one non-path text the profile gets);
`public` and `allow` are refused before a run starts (fail closed), with what
to choose instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources

from crew_common.egress import EgressPolicy
from sandbox_launcher.policy import SandboxPolicy

# Hard-coded like Codex does: a sandbox-exec found via PATH could be anyone's.
SANDBOX_EXEC = "/usr/bin/sandbox-exec"
_READ_RULES_MARKER = ";; @READ_RULES@\n"
_GIT_RULES_MARKER = ";; @GIT_RULES@\n"
_NETWORK_RULES_MARKER = ";; @NETWORK_RULES@\n"
ENFORCED_MODES = ("open", "none")
_GIT_PARAMS = ("GIT_DIR", "GIT_HOOKS", "GIT_CONFIG", "GIT_COMMONDIR")


@cache
def base_profile() -> str:
    """The profile template shipped as package data."""
    return resources.files("sandbox_launcher").joinpath("seatbelt_base.sbpl").read_text("utf-8")


def profile_text(
    read_dirs: int,
    read_files: int,
    guarded_git: int = 0,
    egress_mode: str = "open",
    ports: Sequence[int] = (),
) -> str:
    """The profile for a policy with this many allowlisted dirs and files. Pure."""
    rules = [f'  (subpath (param "READ_DIR_{i}"))\n' for i in range(read_dirs)]
    rules += [f'  (literal (param "READ_FILE_{i}"))\n' for i in range(read_files)]
    git = "".join(_git_rule(i) for i in range(guarded_git))
    return (
        base_profile()
        .replace(_READ_RULES_MARKER, "".join(rules))
        .replace(_GIT_RULES_MARKER, git)
        .replace(_NETWORK_RULES_MARKER, network_rules(egress_mode, ports))
    )


def network_rules(egress_mode: str, ports: Sequence[int]) -> str:
    """The profile's IP rules for an enforced egress mode (`ENFORCED_MODES`). Pure."""
    if egress_mode == "open":
        return ""
    if egress_mode not in ENFORCED_MODES:
        raise ValueError(f"Seatbelt cannot enforce egress mode {egress_mode!r}")
    # The last matching rule wins: all IP refused, then each forwarded port let through.
    allowed = "".join(
        f'(allow network-outbound (remote ip "localhost:{int(port)}"))\n'
        for port in sorted(set(ports))
        if 0 < int(port) < 65536
    )
    return f'(deny network-outbound (remote ip "*:*"))\n{allowed}'


def seatbelt_egress_refusal(egress: EgressPolicy) -> str | None:
    """Why a macOS sandbox cannot be given `egress` (fail closed), or None. Pure."""
    if egress.mode in ENFORCED_MODES:
        return None
    return (
        f"egress mode {egress.mode!r} cannot be enforced on macOS: Seatbelt filters a "
        "sandbox's network by localhost ports only, not by address. Set the agent's "
        "egress to 'none' (only the crew server and the model gateway, which every model "
        "call goes through) or 'open' (your network, as any program of yours)"
    )


def _git_rule(i: int) -> str:
    # The .git entry itself (no rename or delete), its hooks, config and commondir.
    return (
        f'(deny file-write* (literal (param "GIT_DIR_{i}")) (subpath (param "GIT_HOOKS_{i}"))\n'
        f'  (literal (param "GIT_CONFIG_{i}")) (literal (param "GIT_COMMONDIR_{i}")))\n'
    )


def seatbelt_params(policy: SandboxPolicy) -> list[tuple[str, str]]:
    """Every `(param …)` the profile references, with its value (resolved paths)."""
    params = [
        ("HOME", str(policy.home)),
        ("CREW_HOME", str(policy.crew_home)),
        ("SOCKETS_DIR", str(policy.sockets_dir)),
        ("AGENT_DIR", str(policy.agent_dir)),
        ("RUNTIME_DIR", str(policy.runtime_dir)),
        ("TMP_DIR", str(policy.tmp_dir)),
        ("WORK_DIR", str(policy.work_dir)),
    ]
    params += [(f"READ_DIR_{i}", str(p)) for i, p in enumerate(policy.read_dirs)]
    params += [(f"READ_FILE_{i}", str(p)) for i, p in enumerate(policy.read_files)]
    for i, git_dir in enumerate(policy.guarded_git):
        paths = (git_dir, git_dir / "hooks", git_dir / "config", git_dir / "commondir")
        params += [(f"{name}_{i}", str(p)) for name, p in zip(_GIT_PARAMS, paths, strict=True)]
    return params


def seatbelt_argv(
    policy: SandboxPolicy,
    command: list[str],
    egress_mode: str = "open",
    ports: Sequence[int] = (),
) -> list[str]:
    """`sandbox-exec -p <profile> -D NAME=value … -- command…`. Pure."""
    profile = profile_text(
        len(policy.read_dirs),
        len(policy.read_files),
        len(policy.guarded_git),
        egress_mode,
        ports,
    )
    argv = [SANDBOX_EXEC, "-p", profile]
    for name, value in seatbelt_params(policy):
        argv += ["-D", f"{name}={value}"]
    return [*argv, "--", *command]
