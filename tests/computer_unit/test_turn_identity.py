"""The turn file (computer_service/turn_identity.py): written for the turn, gone after it,
never followed through what the agent put in its place."""

from __future__ import annotations

import os
from pathlib import Path

from computer_service.turn_identity import TurnIdentityFile, turn_identity_of
from crew_common.layout import AgentPaths


def paths_in(tmp_path: Path) -> AgentPaths:
    paths = AgentPaths(tmp_path / "crew", "run1", "a1")
    paths.runtime_dir.mkdir(parents=True)
    return paths


def test_a_turns_secret_is_handed_out_and_taken_back(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    turn = TurnIdentityFile(paths)
    turn.hand_out("crt_one")
    assert paths.turn_file.read_text() == "crt_one\n"
    assert paths.turn_file.stat().st_mode & 0o077 == 0
    turn.hand_out("crt_two")  # the next turn's replaces it
    assert paths.turn_file.read_text() == "crt_two\n"
    turn.take_back()
    assert not paths.turn_file.exists()
    turn.take_back()  # twice is fine


def test_a_server_without_secrets_leaves_no_file(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    turn = TurnIdentityFile(paths)
    turn.hand_out("crt_old")
    turn.hand_out(None)
    assert not paths.turn_file.exists()


def test_a_symlink_the_agent_put_there_is_replaced_not_followed(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    outside = tmp_path / "outside"
    outside.write_text("the user's file\n")
    os.symlink(outside, paths.turn_file)
    TurnIdentityFile(paths).hand_out("crt_one")
    assert outside.read_text() == "the user's file\n"
    assert not paths.turn_file.is_symlink() and paths.turn_file.read_text() == "crt_one\n"


def test_a_directory_in_its_place_costs_the_identity_not_the_turn(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    paths.turn_file.mkdir()
    (paths.turn_file / "keep").write_text("x")
    turn = TurnIdentityFile(paths)
    turn.hand_out("crt_one")  # logged, no exception; the name is the Computer's: cleared
    assert not paths.turn_file.exists()
    turn.hand_out("crt_two")
    assert paths.turn_file.read_text() == "crt_two\n"


def test_only_a_workspace_with_agent_paths_has_a_turn_file(tmp_path: Path) -> None:
    class Home:
        paths = paths_in(tmp_path)

    found = turn_identity_of(Home())
    assert found is not None and found.paths == Home.paths
    assert turn_identity_of(object()) is None
