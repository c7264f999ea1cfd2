"""Bootstrap parsing: clear errors, never the token in them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from computer_service.bootstrap import TOKEN_ENV, BootstrapError, load_config, parse_bootstrap

SECRET = "tok-very-secret-123"


def test_valid_bootstrap_with_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CREW_HOME", str(tmp_path / "ch"))
    boot = parse_bootstrap(b'{"server_url": "http://127.0.0.1:8765/", "token": "t"}\n')
    assert boot.server_url == "http://127.0.0.1:8765"
    assert boot.resolved_crew_home() == tmp_path / "ch"
    assert boot.turn_capacity() >= 2
    assert boot.retry_base_s == 5.0
    assert SECRET not in repr(
        parse_bootstrap(f'{{"server_url":"http://x","token":"{SECRET}"}}'.encode())
    )


def test_explicit_fields() -> None:
    boot = parse_bootstrap(
        b'{"server_url":"https://crew.example","token":"t","crew_home":"/tmp/x",'
        b'"max_concurrent_turns":3,"opencode_path":"/bin/oc","sandbox_mode":"tmpfs",'
        b'"retry_base_s":0.25}'
    )
    assert boot.resolved_crew_home() == Path("/tmp/x")
    assert boot.turn_capacity() == 3
    assert boot.sandbox_mode == "tmpfs"
    assert boot.retry_base_s == 0.25


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"", "no bootstrap received"),
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"server_url": "http://x"}', "token"),
        (f'{{"server_url": "ftp://x", "token": "{SECRET}"}}'.encode(), "server_url"),
        (f'{{"server_url": "http://x", "token": "{SECRET}", "extra": 1}}'.encode(), "extra"),
        (
            f'{{"server_url": "http://x", "token": "{SECRET}", "max_concurrent_turns": 0}}'.encode(),
            "max_concurrent_turns",
        ),
        (
            f'{{"server_url": "http://x", "token": "{SECRET}", "sandbox_mode": "none"}}'.encode(),
            "sandbox_mode",
        ),
        (
            f'{{"server_url": "http://x", "token": "{SECRET}", "retry_base_s": 0}}'.encode(),
            "retry_base_s",
        ),
        (b"{" * 70000, "over"),
    ],
)
def test_garbage_is_refused_clearly_without_the_token(line: bytes, expected: str) -> None:
    with pytest.raises(BootstrapError) as info:
        parse_bootstrap(line)
    message = str(info.value)
    assert expected in message
    assert SECRET not in message
    assert "\n" not in message


@pytest.mark.parametrize("bad", ["\n", "\r", "\t", " ", "\x00", "\x7f", "é", "\u2028"])
def test_a_token_that_cannot_be_a_header_value_is_refused_without_echoing_it(bad: str) -> None:
    line = orjson.dumps({"server_url": "http://x", "token": f"{SECRET}{bad}tail"})
    with pytest.raises(BootstrapError) as info:
        parse_bootstrap(line)
    message = str(info.value)
    assert "token" in message and "printable ASCII" in message
    assert SECRET not in message and "tail" not in message


def test_every_printable_ascii_character_is_a_valid_token() -> None:
    token = "".join(chr(c) for c in range(0x21, 0x7F))
    assert parse_bootstrap(orjson.dumps({"server_url": "http://x", "token": token})).token == token


def write_config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "etc" / "computer.json"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(orjson.dumps({"server_url": "http://127.0.0.1:8765", **fields}))
    return path


def test_config_with_a_token_file_and_paths_relative_to_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, token_file="token", crew_home="../crew", opencode_path="/bin/oc")
    (path.parent / "token").write_text(f"{SECRET}\n")
    (path.parent / "token").chmod(0o600)
    boot = load_config(path, {TOKEN_ENV: "not-this-one"})
    assert boot.token == SECRET  # the file wins, its newline dropped
    assert boot.resolved_crew_home() == (tmp_path / "etc" / ".." / "crew").absolute()
    assert boot.opencode_path == Path("/bin/oc")


def test_config_with_the_token_in_the_environment(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path), {TOKEN_ENV: SECRET}).token == SECRET


@pytest.mark.parametrize(
    ("fields", "env", "expected"),
    [
        ({}, {}, "no token"),
        ({}, {TOKEN_ENV: ""}, "no token"),
        ({"token": SECRET}, {}, "must not hold the token"),
        ({"token_file": 7}, {}, "token_file must be a path"),
        ({"token_file": "absent"}, {}, "cannot read the token file"),
        ({"server_url": "ftp://x"}, {TOKEN_ENV: SECRET}, "server_url"),
        ({"extra": 1}, {TOKEN_ENV: SECRET}, "extra"),
        ({}, {TOKEN_ENV: f"{SECRET}\n"}, "printable ASCII"),
    ],
)
def test_bad_configs_are_refused_clearly_without_the_token(
    tmp_path: Path, fields: dict[str, object], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(BootstrapError) as info:
        load_config(write_config(tmp_path, **fields), env)
    assert expected in str(info.value) and SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"[1]", "must be a JSON object"), (b"{", "not valid JSON"), (b" " * 70000, "over")],
)
def test_config_files_that_are_not_one_object(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "computer.json"
    path.write_bytes(content)
    with pytest.raises(BootstrapError, match=expected):
        load_config(path, {TOKEN_ENV: SECRET})


def test_turn_time_limit_defaults_to_30_minutes_and_is_checked() -> None:
    base = '{"server_url": "http://x", "token": "t"'
    assert parse_bootstrap(f"{base}}}".encode()).turn_time_limit_s == 30 * 60
    assert (
        parse_bootstrap(f'{base}, "turn_time_limit_s": 7200}}'.encode()).turn_time_limit_s == 7200
    )
    for bad in ("0", '"60"', "true", "1.5", str(10**9)):
        with pytest.raises(BootstrapError, match="turn_time_limit_s"):
            parse_bootstrap(f'{base}, "turn_time_limit_s": {bad}}}'.encode())


def _with_roots(roots: list[str]) -> bytes:
    return orjson.dumps({"server_url": "http://x", "token": SECRET, "read_only_roots": roots})


def test_read_only_roots_are_accepted_when_safe(isolated_home: Path) -> None:
    repo = isolated_home / "src" / "repo"
    repo.mkdir(parents=True)
    boot = parse_bootstrap(_with_roots([str(repo)]))
    assert boot.read_only_roots == [repo]


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        (".ssh", "lies inside the secret place"),
        (".ssh/keys", "lies inside the secret place"),
        (".local", "contains the secret place"),
        (".config/opencode", "lies inside the secret place"),
        ("", "contains $HOME"),
        (".crew/agents/other", "overlaps the crew home"),
        ("missing", "not an existing directory"),
    ],
)
def test_a_secret_read_only_root_is_refused_with_a_clear_message(
    isolated_home: Path, root: str, expected: str
) -> None:
    path = isolated_home / root if root else isolated_home
    if root != "missing":
        path.mkdir(parents=True, exist_ok=True)
    with pytest.raises(BootstrapError) as caught:
        parse_bootstrap(_with_roots([str(path)]))
    message = str(caught.value)
    assert "read_only_roots" in message and expected in message, message
    assert SECRET not in message


def test_turn_limits_default_and_become_launcher_flags() -> None:
    base = {"server_url": "http://x", "token": "t"}
    default = parse_bootstrap(orjson.dumps(base)).turn_limits
    assert default.launcher_args() == [
        "--max-processes",
        "4096",
        "--memory-mb",
        "4096",
        "--shm-mb",
        "64",
        "--disk-mb",
        "10240",
        "--max-connections",
        "256",
    ]
    limits = {
        "max_processes": 500,
        "memory_mb": 1024,
        "shm_mb": 8,
        "disk_mb": 100,
        "max_connections": 32,
    }
    line = {**base, "turn_limits": limits}
    assert parse_bootstrap(orjson.dumps(line)).turn_limits.launcher_args()[1::2] == [
        "500",
        "1024",
        "8",
        "100",
        "32",
    ]
    for bad in ({"max_processes": 1}, {"shm_mb": "64"}, {"cpus": 2}, {"max_connections": 0}):
        with pytest.raises(BootstrapError, match="turn_limits"):
            parse_bootstrap(orjson.dumps({**base, "turn_limits": bad}))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_token_file_others_can_read_is_refused_like_ssh_does(tmp_path: Path, mode: int) -> None:
    path = write_config(tmp_path, token_file="token")
    token = path.parent / "token"
    token.write_text(f"{SECRET}\n")
    token.chmod(mode)
    with pytest.raises(BootstrapError) as caught:
        load_config(path, {})
    message = str(caught.value)
    assert f"mode {mode:04o}" in message and f"chmod 600 {token}" in message
    assert SECRET not in message
    token.chmod(0o400)  # the fix the message names (or 0600) is accepted
    assert load_config(path, {}).token == SECRET
