"""Git repositories an agent makes: nothing it plants runs as the user, and it can remove them.

Issue 20 item 6, with the real OpenCode and the real launcher, cold and warm.
Turn 1 (a bash tool) makes two repositories in `work/`; in one it plants a
`pre-commit` hook and a `core.fsmonitor` command that would write a marker
(the attack: the user's next `git status`/`git commit` there ran them, since
only repositories that existed when a turn started were guarded). Once the
turn has ended the user's git runs in that repository and no marker appears,
while the agent's own `user.name` stays. Turn 2 removes the other repository
with `rm -rf` (the positive control: the guard's bind mounts made that fail
with "Read-only file system").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from crew_harness.scripted_model import Script, ScriptedModel
from crew_testkit.engine_rig import EngineRig
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MARKER = "git-plant-ran"
PLANT = (
    "git init -q planted && git init -q doomed && echo a > doomed/a && "
    "git -C doomed add a && git -C doomed -c user.email=a@b -c user.name=a commit -qm one && "
    f"printf '#!/bin/sh\\necho hook > {{home}}/{MARKER}\\n' > planted/.git/hooks/pre-commit && "
    "chmod 755 planted/.git/hooks/pre-commit && "
    f"git -C planted config core.fsmonitor 'echo fsmonitor > {{home}}/{MARKER}; false' && "
    "git -C planted config user.name agent-name && echo planted"
)
REMOVE = "rm -rf doomed && echo removed"


def _script(agent_dir: Path) -> dict[str, object]:
    plant = PLANT.replace("{home}", str(agent_dir))
    return {
        "rules": [
            {"match": "PLANT", "reply": {"bash": plant}},
            {"match": "REMOVE", "reply": {"bash": REMOVE}},
        ]
    }


@pytest.fixture
def opencode() -> Path:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    return OPENCODE


def _user_git(repo: Path, *args: str) -> None:
    # What the user runs later, unsandboxed, with hooks and fsmonitor honoured.
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.email=user@host", "-c", "user.name=user"]
    # A root Computer's repositories belong to its engine user: git would refuse them
    # ("dubious ownership"); the worst case is a user who trusts them anyway.
    ident += ["-c", "safe.directory=*"]
    subprocess.run(["git", *ident, "-C", str(repo), *args], env=env, check=True, timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["cold", "warm"])
async def test_hooks_planted_in_a_new_repository_never_run_and_it_can_be_removed(
    opencode: Path, kind: str
) -> None:
    agent_id = f"{kind}git"
    home_dir = Path(os.environ["HOME"])
    agent_dir = home_dir / ".crew" / "agents" / agent_id
    with ScriptedModel(Script.parse(_script(agent_dir))) as model:
        async with EngineRig(model, opencode) as rig:
            home = rig.agent(agent_id)
            assert home.paths.agent_dir == agent_dir
            work = agent_dir / "work"
            planted = await rig.turn(kind, agent_id, "PLANT")
            assert planted.result.status == "succeeded", planted.result.failure
            assert (work / "planted" / ".git").is_dir() and (work / "doomed" / ".git").is_dir()
            repo = work / "planted"
            (repo / "u.txt").write_text("u\n")
            _user_git(repo, "status", "--short")
            _user_git(repo, "add", "u.txt")
            _user_git(repo, "commit", "-qm", "by the user")
            assert not (agent_dir / MARKER).exists(), "a planted hook or fsmonitor ran as the user"
            assert not (repo / ".git" / "hooks" / "pre-commit").exists()
            config = (repo / ".git" / "config").read_text()
            assert "fsmonitor" not in config and "agent-name" in config

            removed = await rig.turn(kind, agent_id, "REMOVE")
            assert removed.result.status == "succeeded", removed.result.failure
            assert not (work / "doomed").exists(), "rm -rf of an earlier turn's repository"
