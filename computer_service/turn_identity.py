"""The running turn's identity, handed to that turn's `crew` (issue 22).

The server answers each registered turn with a secret (`turn_secret`); `crew` sends it
with every write (`Crew-Turn`), so the server counts a write for the turn that made it —
also one that lands after the turn ended. It goes through a file, `runtime/…/turn`
(`AgentPaths.turn_file`, named to the engine by `CREW_TURN_FILE`): a warm engine's
environment is fixed when its server starts, so per-turn data cannot come in a
variable; `crew` reads the file at each call. Written before the engine runs, removed
when the turn ends. The agent can read it (it is its own turn's) and can overwrite it,
which only costs its own writes their turn.
"""

from __future__ import annotations

import logging

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)


class TurnIdentityFile:
    """One agent's turn file: `hand_out` a turn's secret, `take_back` at its end."""

    def __init__(self, paths: AgentPaths) -> None:
        self.paths = paths

    def hand_out(self, secret: str | None) -> None:
        """Before the engine runs: the turn's secret in the file (None: a server that
        gives none; no file, so `crew` sends no identity). Never raises: a turn without
        its identity still runs, its writes count for the agent's latest turn."""
        if secret is None:
            self.take_back()
            return
        try:
            safe_fs.write_file_atomic(
                self.paths.crew_home, self.paths.turn_file, secret.encode("ascii") + b"\n"
            )
        except (UnsafePath, OSError, UnicodeEncodeError) as exc:
            log.warning(
                "agent %s: the turn identity could not be written (%s); its writes count "
                "for its latest turn",
                self.paths.agent_id,
                exc,
            )
            # An older turn's identity left there would bind this turn's writes to it.
            self.take_back()

    def take_back(self) -> None:
        """At the turn's end: no identity between turns. Never raises."""
        try:
            safe_fs.remove_tree(self.paths.crew_home, self.paths.turn_file)
        except (UnsafePath, OSError) as exc:
            log.warning(
                "agent %s: the turn identity could not be removed: %s", self.paths.agent_id, exc
            )


def turn_identity_of(workspace: object) -> TurnIdentityFile | None:
    """The turn file of a prepared agent's workspace (an `AgentHome` has its paths);
    None for one without a runtime directory."""
    paths = getattr(workspace, "paths", None)
    return TurnIdentityFile(paths) if isinstance(paths, AgentPaths) else None
