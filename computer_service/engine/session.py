"""The OpenCode session an agent continues from turn to turn (computer.md §4).

`engines/opencode/session.json` ties a session to the engine, the model and
the AGENTS.md it started with; a turn continues it only when all three are
unchanged (`plan_session`). `Sessions` is the one owner of that file on this
Computer: it plans each turn, keeps the session of a turn that succeeded, and
remembers an agent whose session could not be kept, so that its next turn
starts anew rather than continue an older one. Every file operation goes
through `safe_fs` (the agent can write its engine directory).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

import orjson

from computer_service import safe_fs
from computer_service.engine.base import SessionPlan
from computer_service.safe_fs import UnsafePath
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)

ENGINE_NAME = "opencode"
SESSION_FILE_LIMIT = 64 * 1024
# The session ids a run request may carry (the launcher's SESSION_PATTERN): the agent can
# edit session.json, and an id the launcher refuses would fail every turn from then on.
SESSION_ID = re.compile(r"ses_[A-Za-z0-9]{1,100}")


@dataclass(frozen=True)
class SessionRecord:
    """The content of `engines/opencode/session.json`."""

    engine: str
    model: str
    agents_md_digest: str
    session_id: str

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "engine": self.engine,
                "model": self.model,
                "agents_md_sha256": self.agents_md_digest,
                "session_id": self.session_id,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> SessionRecord | None:
        """Parse a record; None for anything malformed (the agent may have edited it)."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        fields = [obj.get(k) for k in ("engine", "model", "agents_md_sha256", "session_id")]
        if not all(isinstance(f, str) and f for f in fields):
            return None
        engine, model, digest, session_id = (str(f) for f in fields)
        if not SESSION_ID.fullmatch(session_id):
            return None
        return cls(engine, model, digest, session_id)


def agents_md_digest(agents_md: str) -> str:
    """The digest that ties a saved session to the AGENTS.md it started with."""
    return hashlib.sha256(agents_md.encode("utf-8")).hexdigest()


def plan_session(
    record: SessionRecord | None, engine: str, model: str, agents_md: str
) -> SessionPlan:
    """Continue the saved session only when engine, model and AGENTS.md are all unchanged."""
    digest = agents_md_digest(agents_md)
    if (
        record is not None
        and record.engine == engine
        and record.model == model
        and record.agents_md_digest == digest
    ):
        return SessionPlan(record.session_id, digest)
    return SessionPlan(None, digest)


def read_session_record(paths: AgentPaths) -> SessionRecord | None:
    """The saved session of an agent; None when missing, malformed or not a regular file."""
    try:
        data = safe_fs.read_regular_file(paths.crew_home, paths.session_file, SESSION_FILE_LIMIT)
    except UnsafePath as exc:
        log.warning("agent %s: ignoring the saved session: %s", paths.agent_id, exc)
        return None
    return None if data is None else SessionRecord.from_json(data)


def write_session_record(paths: AgentPaths, record: SessionRecord) -> None:
    """Save the session record (temp file + rename, 0600). Raises `UnsafePath`."""
    safe_fs.write_file_atomic(paths.crew_home, paths.session_file, record.to_json())


class Sessions:
    """The agents' saved sessions (module doc): plan a turn, keep a succeeded one's."""

    def __init__(self, engine: str = ENGINE_NAME) -> None:
        self.engine = engine
        # Agents whose last session could not be saved: their next turn starts a new one.
        self._lost: set[str] = set()

    def plan(self, paths: AgentPaths, model: str, agents_md: str) -> SessionPlan:
        """Continue the saved session when engine, model and AGENTS.md are unchanged."""
        plan = plan_session(read_session_record(paths), self.engine, model, agents_md)
        if paths.agent_id in self._lost:
            # The session the last turn used was never saved: do not continue an older one.
            return SessionPlan(None, plan.agents_md_digest)
        return plan

    def keep(self, paths: AgentPaths, plan: SessionPlan, model: str, session_id: str) -> bool:
        """Save the session a succeeded turn used; False when it could not be saved (logged).

        The turn still succeeds (its replies went out); the agent's next turn
        starts a new session. A plan made by hand (no AGENTS.md digest) saves
        nothing and loses nothing: True.
        """
        if plan.agents_md_digest is None:
            return True
        record = SessionRecord(self.engine, model, plan.agents_md_digest, session_id)
        try:
            write_session_record(paths, record)
        except Exception as exc:
            log.warning(
                "agent %s: the session could not be saved (%s); the next turn starts a new one",
                paths.agent_id,
                exc,
            )
            self._lost.add(paths.agent_id)
            return False
        self._lost.discard(paths.agent_id)
        return True
