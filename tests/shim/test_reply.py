"""`crew reply` against a real crew-server: sent, HELD, threads, refusals, timeouts."""

from __future__ import annotations

import socket
import time
import uuid
from datetime import datetime

import pytest

from tests.shim.world import EXAMPLE_ID, World

pytestmark = pytest.mark.timeout(60)

TRICKY = (
    "Done — `ls -la` and $(rm -rf ~) and $HOME, 'single' \"double\" \\n 🎉🚀\n\n  indented line\t"
)


def test_reply_is_sent_byte_for_byte(world: World) -> None:
    room = world.dm["id"]
    result = world.crew("reply", room, stdin=TRICKY + "\n\n  \t\n")
    assert (result.code, result.stderr) == (0, "")
    assert result.stdout == f"Message sent to room {room}.\n"
    world.check("reply: sent", result)
    stored = world.messages(room)
    assert [m["body"] for m in stored] == [TRICKY.rstrip()]
    assert stored[0]["author"]["id"] == world.alice.id


def test_held_then_sending_again_posts(world: World) -> None:
    room = world.group["id"]
    world.server.post(room, "@alice can you write the release note?")
    world.server.post(room, "Also, line two\nof a longer message.")
    held = world.crew("reply", room, stdin="On it.\n")
    assert held.code == 1 and held.stderr == ""
    assert held.stdout.startswith(
        'Not sent: new messages arrived in this room.\n\n## Group "launch"'
    )
    assert held.stdout.endswith(
        f"Reply with: crew reply {room}\n\n"
        "Run crew reply again to send as is or with changes, or do nothing.\n"
    )
    assert "can you write the release note?" in held.stdout
    world.check("reply: held", held)
    assert [m["body"] for m in world.messages(room)][-1] == "Also, line two\nof a longer message."

    again = world.crew("reply", room, stdin="On it.\n")
    assert (again.code, again.stdout) == (0, f"Message sent to room {room}.\n")
    assert [m["body"] for m in world.messages(room)][-1] == "On it."


def test_thread_is_created_then_reused(world: World) -> None:
    room = world.group["id"]
    root = world.server.post(room, "Can someone check the nightly build?")
    world.normalise.name(root["id"], "root-message")
    world.crew("reply", room, stdin="Looking.")  # HELD: sees the root message first
    first = world.crew("reply", room, "--thread", root["id"], stdin="Checking in a thread.")
    assert first.code == 0, first.stderr
    thread_id = first.stdout.split("It is in thread ")[1].split(";")[0]
    world.normalise.name(thread_id, "thread")
    assert first.stdout == (
        f"Message sent to room {room}.\n"
        f"It is in thread {thread_id}; send later replies in this thread with: crew reply {thread_id}\n"
    )
    world.check("reply: --thread creates the thread", first)

    second = world.crew("reply", room, "--thread", root["id"], stdin="Still on it.")
    assert second.code == 0, second.stderr
    assert f"It is in thread {thread_id};" in second.stdout

    third = world.crew("reply", thread_id, stdin="Fixed: a flaky test.")
    assert (third.code, third.stdout) == (0, f"Message sent to room {thread_id}.\n")
    world.check("reply: in the thread by its id", third)
    assert [m["body"] for m in world.messages(thread_id)] == [
        "Checking in a thread.",
        "Still on it.",
        "Fixed: a flaky test.",
    ]
    # A thread reply adds nothing to the group timeline.
    assert [m["body"] for m in world.messages(room)] == ["Can someone check the nightly build?"]

    # New messages in the thread hold a reply there; the section shows the thread.
    world.server.post(room, "@alice which test?", thread_of=root["id"])
    held = world.crew("reply", thread_id, stdin="test_login.")
    assert held.code == 1
    assert f'## Thread in group "launch" (room {room})' in held.stdout
    assert "Root: [#1 " in held.stdout and "Can someone check the nightly build?" in held.stdout
    world.check("reply: held in a thread", held)


def test_thread_refusals(world: World) -> None:
    group = world.group["id"]
    other = world.server.post(world.dm["id"], "a message of another room")
    world.normalise.name(other["id"], "dm-message")
    elsewhere = world.crew("reply", group, "--thread", other["id"], stdin="hi")
    assert elsewhere.code == 1 and elsewhere.stdout == "" and elsewhere.stderr.startswith("error: ")
    world.check("reply --thread refused: a message of another room", elsewhere)

    unknown = world.crew("reply", group, "--thread", EXAMPLE_ID, stdin="hi")
    assert unknown.code == 1 and unknown.stderr.startswith("error: ")
    world.check("reply --thread refused: no such message", unknown)
    assert world.messages(group) == []


@pytest.mark.parametrize("where", ["dm", "thread"])
def test_thread_outside_a_group_is_refused(world: World, where: str) -> None:
    room = world.dm["id"]
    if where == "thread":
        root = world.server.post(world.group["id"], "root")
        room = world.server.post(world.group["id"], "in it", thread_of=root["id"])["room_id"]
    message = world.server.post(room, "hello")
    world.crew("reply", room, stdin="seen")  # HELD: now it has seen the message
    result = world.crew("reply", room, "--thread", message["id"], stdin="in a thread?")
    assert result.code == 1 and result.stdout == "" and result.stderr.startswith("error: ")


@pytest.mark.parametrize(
    ("case", "argv", "stdin"),
    [
        ("no room id", [], "hi"),
        ("room id not a uuid", ["launch"], "hi"),
        ("thread id not a uuid", ["{group}", "--thread", "41"], "hi"),
        ("body on the command line", ["{group}", "hello", "world"], None),
        ("empty body", ["{group}"], ""),
        ("only whitespace", ["{group}"], " \n\t\n"),
        ("body too long", ["{group}"], "x" * 20_001),
        ("not utf-8", ["{group}"], b"caf\xe9"),
        ("unknown option", ["{group}", "--to", "bob"], "hi"),
    ],
)
def test_local_refusals_send_nothing(
    world: World, case: str, argv: list[str], stdin: str | bytes | None
) -> None:
    room = world.group["id"]
    args = [arg.replace("{group}", room) for arg in argv]
    result = world.crew("reply", *args, stdin=stdin)
    assert result.code == 1 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    if isinstance(stdin, str) and len(stdin) > 100:
        result.stdin = b"<20,001 times x>"
    world.check(f"reply refused locally: {case}", result)
    assert world.messages(room) == []


def test_only_its_two_variables_count(world: World) -> None:
    """A proxy, a TZ or Python variables in the environment change nothing."""
    result = world.crew(
        "reply",
        world.dm["id"],
        stdin="through no proxy",
        extra_env={
            "HTTP_PROXY": "http://127.0.0.1:9",
            "http_proxy": "http://127.0.0.1:9",
            "ALL_PROXY": "http://127.0.0.1:9",
            "TZ": "Asia/Tokyo",
        },
    )
    assert (result.code, result.stderr) == (0, "")
    assert world.messages(world.dm["id"])[0]["body"] == "through no proxy"
    # Times follow the machine's zone (/etc/localtime), not TZ.
    remind = world.crew(
        "remind", world.dm["id"], "x", "--at", "23:59", extra_env={"TZ": "Asia/Tokyo"}
    )
    assert remind.code == 0, remind.stderr
    local = datetime.now().astimezone().strftime("%z")
    assert f"23:59 {local[:3]}:{local[3:]}" in remind.stdout


def test_largest_body_is_accepted(world: World) -> None:
    body = "🙂" * 20_000
    result = world.crew("reply", world.dm["id"], stdin=body)
    assert result.code == 0, result.stderr
    assert world.messages(world.dm["id"])[0]["body"] == body


def test_server_refusals_are_translated(world: World) -> None:
    unknown = str(uuid.uuid4())
    world.normalise.name(unknown, "unknown-room")
    missing = world.crew("reply", unknown, stdin="hi")
    assert missing.code == 1 and missing.stderr.startswith(f"error: there is no room {unknown}.")
    world.check("reply refused by the server: no such room", missing)

    foreign = world.crew("reply", world.bob_dm["id"], stdin="hi")
    assert foreign.code == 1 and "you may not write in room" in foreign.stderr
    world.check("reply refused by the server: someone else's dm", foreign)

    world.alice.token_file.write_text("cra_not-a-real-token\n")
    expired = world.crew("reply", world.dm["id"], stdin="hi")
    assert expired.code == 1 and "token" in expired.stderr
    world.check("reply refused by the server: token expired", expired)
    assert world.messages(world.dm["id"]) == []
    assert world.messages(world.bob_dm["id"]) == []


def test_unreachable_and_unset(world: World) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connection refused
        refused = world.crew("reply", world.dm["id"], stdin="hi", url=f"http://127.0.0.1:{port}")
    assert refused.code == 1 and "nothing was sent" in refused.stderr
    world.check("reply: server unreachable", refused)

    world.alice.token_file.unlink()
    no_token = world.crew("reply", world.dm["id"], stdin="hi")
    assert no_token.code == 1 and "cannot be read" in no_token.stderr
    no_token.stderr = no_token.stderr.replace(str(world.tmp_path), "<tmp>")
    world.check("reply: token file missing", no_token)


@pytest.mark.timeout(40)
def test_silent_server_times_out_in_ten_seconds(world: World) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections (the kernel does) but never answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        result = world.crew("reply", world.dm["id"], stdin="hi", url=f"http://127.0.0.1:{port}")
        elapsed = time.monotonic() - started
    assert result.code == 1 and result.stdout == ""
    assert "did not answer within 10 seconds" in result.stderr
    assert "may have been sent" in result.stderr and "again is safe" in result.stderr
    assert 9.5 <= elapsed < 13, elapsed
    world.check("reply: server silent (timeout)", result)


def test_help_texts(world: World) -> None:
    for argv, name in (
        (["--help"], "help: crew --help"),
        (["reply", "--help"], "help: crew reply --help"),
        (["task", "--help"], "help: crew task --help"),
        (["remind", "--help"], "help: crew remind --help"),
        (["mute", "--help"], "help: crew mute --help"),
    ):
        result = world.crew(*argv)
        assert (result.code, result.stderr) == (0, "")
        assert "<<'EOF'" in result.stdout and "\nEOF\n" in result.stdout
        world.check(name, result)
    for argv, name in (([], "no command"), (["sned"], "unknown command")):
        result = world.crew(*argv)
        assert result.code == 1 and result.stderr.startswith("error: ")
        world.check(f"usage: {name}", result)
