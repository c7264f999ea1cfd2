"""Aliases of deny roots found in mountinfo: a pure table test (issue 12 escape 3, issue 20)."""

from __future__ import annotations

import pytest

from sandbox_launcher.mounts import Unjudged, aliases, judge, parse_mountinfo

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


def ovl(point: str, options: str, root: str = "/") -> str:
    return f"100 27 0:60 {root} {point} rw - overlay overlay rw,{options},uuid=on"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # an overlay of $HOME itself: its own device, so the device match alone missed it
        (ovl("/srv/o", "lowerdir=/home/u,upperdir=/var/u,workdir=/var/w"), ["/srv/o"]),
        # … of a secret place inside it
        (ovl("/srv/o", "lowerdir=/var/l:/home/u/.ssh,upperdir=/var/u,workdir=/var/w"), ["/srv/o"]),
        # … whose upper directory (the copied-up files) lies in $HOME
        (ovl("/srv/o", "lowerdir=/var/l,upperdir=/home/u/up,workdir=/home/u/w"), ["/srv/o"]),
        # … of /home: $HOME shows below its mount point
        (ovl("/srv/o", "lowerdir=/home,upperdir=/var/u,workdir=/var/w"), ["/srv/o/u"]),
        # a bind of a directory of that overlay
        (ovl("/srv/k", "lowerdir=/home,upperdir=/var/u,workdir=/var/w", "/u/.kube"), ["/srv/k"]),
        # the mount API's own keys (lowerdir+, datadir+)
        (ovl("/srv/o", "lowerdir+=/var/l,datadir+=/home/u/d"), ["/srv/o"]),
        # escaped layer names: a space (octal), a colon and a comma (backslash)
        (ovl("/srv/o", "lowerdir=/home/u/a\\040b\\134\\054c\\134:d:/var/l"), ["/srv/o"]),
        # an overlay of nothing of ours (a container's layers)
        (ovl("/srv/o", "lowerdir=/var/lib/l1:/var/lib/l2,upperdir=/var/u,workdir=/var/w"), []),
        # bindfs of $HOME (FUSE: the source is the directory it shows)
        ("101 27 0:61 / /srv/b rw - fuse /home/u rw,user_id=0,group_id=0,allow_other", ["/srv/b"]),
        ("102 27 0:62 / /srv/b rw - fuse.bindfs /home rw,user_id=0", ["/srv/b/u"]),
        ("103 27 0:63 / /srv/b rw - fuse /var/data rw,user_id=0", []),
        # a FUSE mount of unknown origin (sshfs, gvfs, rclone): masked
        ("104 27 0:64 / /mnt/nas rw - fuse.sshfs me@nas:/home rw,user_id=0", ["/mnt/nas"]),
        # a disk's own file system through FUSE (ntfs-3g): judged by device like ext4
        ("105 27 8:17 / /mnt/win rw - fuseblk /dev/sdb1 rw,user_id=0", []),
        # a mount inside $HOME is hidden with it, whatever it shows
        ("106 27 0:66 / /home/u/nas rw - fuse.sshfs me@nas:/ rw", []),
    ],
)
def test_overlay_and_fuse_aliases(line: str, expected: list[str]) -> None:
    assert aliases(info(line), ("/home/u",)) == expected


def test_an_overlay_of_an_alias_is_an_alias() -> None:
    text = info(
        "90 27 254:0 /home/u/.kube /srv/kube rw - ext4 /dev/vda rw",
        ovl("/srv/o", "lowerdir=/srv/kube,upperdir=/var/u,workdir=/var/w"),
    )
    assert aliases(text, ("/home/u",)) == ["/srv/kube", "/srv/o"]


def test_what_cannot_be_judged_is_named() -> None:
    text = info(
        "104 27 0:64 / /mnt/nas rw - fuse.sshfs me@nas:/home rw,user_id=0",
        ovl("/srv/rel", "lowerdir=relative/dir,upperdir=/var/u,workdir=/var/w"),
        "101 27 0:61 / /srv/b rw - fuse /home/u rw,user_id=0",
    )
    found = judge(text, ("/home/u",))
    assert found.aliases == ["/mnt/nas", "/srv/rel", "/srv/b"]
    assert found.unjudged == [
        Unjudged("/mnt/nas", "fuse.sshfs", "me@nas:/home"),
        Unjudged("/srv/rel", "overlay", "overlay"),
    ]
    assert "/mnt/nas: a fuse.sshfs mount of me@nas:/home whose origin cannot be judged" in str(
        found.unjudged[0]
    )


def test_the_mount_home_lies_on_is_never_masked() -> None:
    # a container whose root is an overlay (layers in the host's namespace, maybe in a
    # $HOME of the same path), a home on sshfs: they hold the deny root itself
    text = "\n".join(
        [
            ovl("/", "lowerdir=/home/u/.local/share/containers/l,upperdir=/u,workdir=/w"),
            "110 100 0:70 / /home rw - fuse.sshfs me@nas:/home rw",
        ]
    )
    assert judge(text, ("/home/u",)).aliases == []


def test_parse_skips_what_is_no_tree() -> None:
    text = "1 2 0:4 net:[4026531840] /run/netns/x rw - nsfs nsfs rw\nshort line\n" + ROOT
    assert [str(m.mount_point) for m in parse_mountinfo(text)] == ["/"]


def test_parse_reads_type_source_and_options_past_the_optional_fields() -> None:
    line = "40 27 0:40 / /srv/o rw,relatime shared:5 master:2 - overlay my\\040src rw,lowerdir=/a"
    (mount,) = parse_mountinfo(line)
    assert (mount.fs_type, mount.source, mount.options) == ("overlay", "my src", "rw,lowerdir=/a")
