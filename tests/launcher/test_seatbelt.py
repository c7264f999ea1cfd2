"""The Seatbelt profile: golden text, parameters only, and no path text ever inside it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crew_common.egress import EgressPolicy
from sandbox_launcher.policy import SandboxPolicy
from sandbox_launcher.seatbelt import (
    SANDBOX_EXEC,
    base_profile,
    profile_text,
    seatbelt_argv,
    seatbelt_egress_refusal,
    seatbelt_params,
)

GOLDEN = Path(__file__).parents[1] / "snapshots" / "seatbelt.sbpl"


def policy(paths: list[str] | None = None, reads: int = 2, files: int = 1) -> SandboxPolicy:
    p = [Path(x) for x in (paths or [])]
    defaults = [
        Path("/Users/u"),
        Path("/Users/u/.crew"),
        Path("/Users/u/.crew/agents/a1"),
        Path("/Users/u/.crew/runtime/r1/agents/a1"),
        Path("/Users/u/.crew/runtime/r1/agents/a1/tmp"),
        Path("/Users/u/.crew/agents/a1/work"),
    ]
    p += defaults[len(p) :]
    extra = [Path(f"/Users/u/.pyenv/versions/3.11.{i}") for i in range(reads + files)]
    return SandboxPolicy(
        home=p[0],
        crew_home=p[1],
        agent_dir=p[2],
        runtime_dir=p[3],
        tmp_dir=p[4],
        work_dir=p[5],
        read_dirs=tuple(extra[:reads]),
        read_files=tuple(extra[reads:]),
    )


def test_profile_matches_the_golden_file() -> None:
    text = profile_text(2, 1)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def _code(text: str) -> str:
    """The profile without comments and string literals (for structure checks)."""
    text = re.sub(r";[^\n]*", "", text)
    text = re.sub(r'#"(?:[^"\\]|\\.)*"', '""', text)
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def test_profile_is_balanced_and_every_param_is_passed() -> None:
    p = policy()
    text = profile_text(len(p.read_dirs), len(p.read_files))
    depth = 0
    for ch in _code(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    used = set(re.findall(r'\(param "([A-Z_0-9]+)"\)', text))
    passed = {name for name, _ in seatbelt_params(p)}
    assert used == passed


def test_policy_shape() -> None:
    text = _code(base_profile())
    # deny by default; contents below HOME denied before the allowlist re-allows them
    assert text.lstrip().startswith("(version 1)")
    assert "(deny default)" in text
    deny = text.index("(deny file-read-data file-read-xattr")
    allow = text.index("(allow file-read-data file-read-xattr")
    assert text.index("(allow file-read*)") < deny < allow
    # the crew sockets stay denied: the last network-outbound rule
    last = text.rindex("network-outbound")
    assert text[text.rindex("(", 0, last) :].startswith("(deny network-outbound")
    assert "SOCKETS_DIR" in base_profile()[base_profile().rindex("network-outbound") :]
    # no blanket mach-lookup or sysctl-read, no Keychain or LaunchServices
    assert "(allow mach-lookup)" not in text and "(allow sysctl-read)" not in text
    for name in (
        "com.apple.SecurityServer",
        "com.apple.securityd.xpc",
        "com.apple.coreservices.launchservicesd",
    ):
        assert f'"{name}"' not in base_profile()


def test_argv_passes_paths_as_parameters() -> None:
    p = policy()
    argv = seatbelt_argv(p, ["/opt/opencode", "run"])
    assert argv[:2] == [SANDBOX_EXEC, "-p"]
    assert argv[2] == profile_text(2, 1)
    defines = argv[3 : argv.index("--")]
    assert defines[0::2] == ["-D"] * (len(defines) // 2)
    assert defines[1::2] == [f"{name}={value}" for name, value in seatbelt_params(p)]
    assert argv[argv.index("--") + 1 :] == ["/opt/opencode", "run"]


odd_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
odd_path = st.builds(
    lambda a, b: f"/{a}/{b}",
    odd_text | st.sampled_from(['a"b', "a)(b", "x\ny", '") (allow default) ("', "é/ü/日本"]),
    odd_text,
)


@settings(max_examples=150, deadline=None)
@given(paths=st.lists(odd_path, min_size=6, max_size=6), reads=st.integers(0, 3))
def test_no_path_text_ever_appears_in_the_profile(paths: list[str], reads: int) -> None:
    p = policy(paths, reads=reads, files=1)
    argv = seatbelt_argv(p, ["/bin/true"])
    profile = argv[2]
    # The profile depends on nothing but the number of allowlist entries.
    assert profile == profile_text(reads, 1)
    template = base_profile()
    for path in paths:
        if path not in template:  # text that is in the fixed template anyway proves nothing
            assert path not in profile
    # Each path travels as its own -D argument, intact.
    values = dict(seatbelt_params(p))
    assert [values[k] for k in ("HOME", "CREW_HOME", "AGENT_DIR")] == [
        str(Path(x)) for x in paths[:3]
    ]


def test_egress_none_lets_ip_through_only_to_the_forwarded_localhost_ports() -> None:
    text = profile_text(2, 1, egress_mode="none", ports=[8123, 4242, 8123])
    lines = [line for line in text.splitlines() if "remote ip" in line]
    # The last matching rule wins in a Seatbelt profile: the refusal first, then each port.
    assert lines == [
        '(deny network-outbound (remote ip "*:*"))',
        '(allow network-outbound (remote ip "localhost:4242"))',
        '(allow network-outbound (remote ip "localhost:8123"))',
    ]
    assert text.index('(remote ip "*:*")') > text.index("(allow network*)")
    # Open is today's profile (the golden file), without any IP rule.
    assert profile_text(2, 1, egress_mode="open", ports=[8123]) == profile_text(2, 1)
    argv = seatbelt_argv(policy(), ["/bin/true"], "none", (8123,))
    assert '(remote ip "localhost:8123")' in argv[2]


@pytest.mark.parametrize("mode", ["public", "allow"])
def test_egress_seatbelt_cannot_enforce_is_refused_with_what_to_choose(mode: str) -> None:
    refusal = seatbelt_egress_refusal(EgressPolicy(mode))
    assert refusal is not None and f"{mode!r} cannot be enforced on macOS" in refusal
    assert "'none'" in refusal and "'open'" in refusal
    with pytest.raises(ValueError, match="cannot enforce"):
        profile_text(0, 0, egress_mode=mode)
    assert seatbelt_egress_refusal(EgressPolicy("none")) is None
    assert seatbelt_egress_refusal(EgressPolicy("open")) is None
