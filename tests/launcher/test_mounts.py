"""Aliases of deny roots found in mountinfo: a pure table test (issue 12, escape 3)."""

from __future__ import annotations

import pytest

from sandbox_launcher.mounts import aliases, parse_mountinfo

ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw"
PROC = "22 27 0:21 / /proc rw,relatime - proc proc rw"


def info(*lines: str) -> str:
    return "\n".join([ROOT, PROC, *lines]) + "\n"


@pytest.mark.parametrize(
    ("text", "deny", "expected"),
    [
        # nothing else of that file system mounted
        (info(), ("/home/u",), []),
        # mount --bind ~/.kube /srv/alias
        (
            info("90 27 254:0 /home/u/.kube /srv/alias rw - ext4 /dev/vda rw"),
            ("/home/u",),
            ["/srv/alias"],
        ),
        # a bind of all of /home: the deny root shows below it
        (info("91 27 254:0 /home /mnt/home rw - ext4 /dev/vda rw"), ("/home/u",), ["/mnt/home/u"]),
        # /home on its own partition, a bind of a directory inside it
        (
            info(
                "92 27 8:2 / /home rw - ext4 /dev/sda2 rw",
                "93 27 8:2 /u/.ssh /srv/keys rw - ext4 /dev/sda2 rw",
            ),
            ("/home/u",),
            ["/srv/keys"],
        ),
        # the same path on another file system is no alias
        (info("94 27 8:3 /home/u /srv/other rw - ext4 /dev/sda3 rw"), ("/home/u",), []),
        # a mount inside a deny root is hidden with it
        (info("95 27 254:0 /home/u/.kube /home/u/work/k rw - ext4 /dev/vda rw"), ("/home/u",), []),
        # two deny roots; an alias of the crew home outside $HOME
        (
            info("96 27 254:0 /srv/crew/agents /opt/agents rw - ext4 /dev/vda rw"),
            ("/home/u", "/srv/crew"),
            ["/opt/agents"],
        ),
        # an alias covered by a later mount is not reachable
        (
            info(
                "97 27 254:0 /home/u /srv/alias rw - ext4 /dev/vda rw",
                "98 97 0:50 / /srv/alias rw - tmpfs tmpfs rw",
            ),
            ("/home/u",),
            [],
        ),
        # escaped names (a space)
        (
            info("99 27 254:0 /home/u/my\\040keys /srv/my\\040alias rw - ext4 /dev/vda rw"),
            ("/home/u",),
            ["/srv/my alias"],
        ),
    ],
)
def test_aliases(text: str, deny: tuple[str, ...], expected: list[str]) -> None:
    assert aliases(text, deny) == expected


def test_parse_skips_what_is_no_tree() -> None:
    text = "1 2 0:4 net:[4026531840] /run/netns/x rw - nsfs nsfs rw\nshort line\n" + ROOT
    assert [str(m.mount_point) for m in parse_mountinfo(text)] == ["/"]
