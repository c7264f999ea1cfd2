"""Who may act: the user token, Computers with their tokens, agents with theirs."""

from __future__ import annotations

import hashlib
import logging
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from crew_common.egress import EgressError, EgressPolicy
from crew_common.permissions import PermissionPolicy, PolicyError
from crew_server import rules
from crew_server.errors import (
    Conflict,
    Invalid,
    InvalidEgress,
    InvalidPermission,
    NotConnected,
    NotFound,
    Superseded,
    Unauthorized,
    UnknownModel,
)
from crew_server.store.answered import ack_answered_rooms
from crew_server.store.approval_state import RECONNECTED, close_turn_approvals
from crew_server.store.budgets import budget_state, read_budget, stored_budget
from crew_server.store.capabilities import read_capabilities, stored_capabilities, synced
from crew_server.store.db import StorePart, Transaction, new_id
from crew_server.store.removals import revoked_reason
from crew_server.store.turn_binding import bound_turn

log = logging.getLogger("crew_server.store")

# Where a new user token goes before it is stored (printed, or written to a file).
TokenKeeper = Callable[[str], None]


def hash_token(token: str) -> str:
    """Tokens are random 32-byte secrets, so a plain sha256 is a safe stored form."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    """A fresh bearer token; the prefix tells a reader which kind it is."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


@dataclass(frozen=True)
class Actor:
    """Who acts on the agent/user API: the user, or an agent (with its handle)."""

    kind: str  # "user" | "agent"
    id: str
    handle: str | None = None
    # An agent's: the turn its messages belong to (`AgentIdentity.turn_id`).
    turn_id: str | None = None


USER = Actor("user", "user")


@dataclass(frozen=True)
class AgentIdentity:
    """What an agent token proves."""

    agent_id: str
    handle: str
    computer_id: str
    # The turn its write belongs to (`turn_binding.bound_turn`); None before its first.
    turn_id: str | None = None


AGENT_COLS = (
    "id, handle, name, persona, engine, model, computer_id, turn_time_limit_s, egress, budget, "
    "permission"
)


def agent_of(row: sqlite3.Row) -> dict[str, Any]:
    """An agent row (`AGENT_COLS`) as the API shows it."""
    return {
        "id": row["id"],
        "handle": row["handle"],
        "name": row["name"],
        "persona": row["persona"],
        "engine": row["engine"],
        "model": row["model"],
        "computer_id": row["computer_id"],
        "turn_time_limit_s": row["turn_time_limit_s"],
        "egress": orjson.loads(row["egress"]),
        "budget": read_budget(row["budget"]).as_json(),
        "permission": orjson.loads(row["permission"]),
    }


def stored_egress(egress: Any) -> str:
    """An egress policy in the user's form (None: the default) checked and normalised by
    `crew_common.egress`, as stored; `InvalidEgress` (422) with its reason."""
    try:
        policy = EgressPolicy.parse(egress)
    except EgressError as exc:
        raise InvalidEgress(str(exc)) from exc
    return orjson.dumps(policy.as_json()).decode()


def stored_permission(permission: Any) -> str:
    """A permission policy in the user's form (None: the default) checked and normalised by
    `crew_common.permissions`, as stored; `InvalidPermission` (422) with its reason."""
    try:
        policy = PermissionPolicy.parse(permission)
    except PolicyError as exc:
        raise InvalidPermission(str(exc)) from exc
    return orjson.dumps(policy.as_dict()).decode()


def check_computer(tx: Transaction, computer_id: str | None) -> None:
    """NotFound unless `computer_id` is None or names a Computer."""
    if (
        computer_id is not None
        and tx.execute(
            "SELECT 1 FROM computers WHERE id = ? AND deleted_at IS NULL", (computer_id,)
        ).fetchone()
        is None
    ):
        raise NotFound(f"no computer {computer_id}; create it with POST /api/computers first")


def check_model(tx: Transaction, model: str, computer_id: str | None) -> list[str]:
    """`UnknownModel` unless the agent's Computer can run `model` (`rules.check_model`);
    else the warnings of the answer (why the model could not be checked)."""
    name, reported = None, []
    if computer_id is not None:
        row = tx.execute(
            "SELECT name, models FROM computers WHERE id = ?", (computer_id,)
        ).fetchone()
        if row is not None:
            name, reported = row["name"], orjson.loads(row["models"])
    check = rules.check_model(model, name, reported)
    if check.refusal is not None:
        raise UnknownModel(check.refusal, list(check.nearest))
    return [check.unchecked] if check.unchecked is not None else []


def connection_epoch(tx: Transaction, computer_id: str, epoch: int | None) -> int:
    """The epoch a Computer's request acts for: its own (checked to be current), or, when
    the caller gives none (the store's own callers), the current one."""
    row = tx.execute("SELECT epoch FROM computers WHERE id = ?", (computer_id,)).fetchone()
    current = int(row["epoch"]) if row is not None else 0
    if epoch is None:
        return current
    if current == 0:
        raise NotConnected("this computer has not connected; call POST /computer/connect first")
    if epoch < current:
        raise Superseded(
            f"this connection (epoch {epoch}) was replaced by a newer one (epoch {current}) "
            "with the same Computer token: another crew-computer is using it. Stop this one; "
            "only one Computer may use a token"
        )
    if epoch > current:
        raise Invalid(
            f"Crew-Epoch {epoch} was never given to this Computer (its latest is {current}); "
            "send the epoch POST /computer/connect answered"
        )
    return epoch


def own_agent(tx: Transaction, computer_id: str, agent_id: str) -> None:
    """A Computer sees only its own agents: anything else is 'not found'."""
    row = tx.execute("SELECT computer_id FROM agents WHERE id = ?", (agent_id,)).fetchone()
    if row is None or row["computer_id"] != computer_id:
        raise NotFound(f"no agent {agent_id} on this computer")


class Identities(StorePart):
    """The user token, Computers and agents, and the tokens that prove them."""

    # ------------------------------------------------------------------ tokens

    def ensure_user_token(self, keep: TokenKeeper | None = None) -> str | None:
        """Create the user token at first start; returns it then (once), else None.

        `keep` gets the new token before it is stored: when it raises (the token file
        cannot be written), no token is stored, so the next start tries again.
        """
        with self._database.write() as tx:
            row = tx.execute("SELECT 1 FROM settings WHERE key = 'user_token_hash'").fetchone()
            if row is not None:
                return None
            token = new_token("cru")
            tx.execute("INSERT INTO settings VALUES ('user_token_hash', ?)", (hash_token(token),))
            if keep is not None:
                keep(token)
            return token

    def reset_user_token(self, keep: TokenKeeper | None = None) -> str:
        """Replace the user token (the old one stops working) and return the new one.

        As with `ensure_user_token`, the old token stays when `keep` raises.
        """
        token = new_token("cru")
        with self._database.write() as tx:
            tx.execute(
                "INSERT INTO settings VALUES ('user_token_hash', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (hash_token(token),),
            )
            if keep is not None:
                keep(token)
        return token

    def check_user_token(self, token: str) -> bool:
        """Whether `token` is the user token."""
        with self._database.read() as tx:
            row = tx.execute("SELECT value FROM settings WHERE key = 'user_token_hash'").fetchone()
        return row is not None and secrets.compare_digest(row["value"], hash_token(token))

    def computer_by_token(self, token: str) -> str:
        """The Computer id a computer token belongs to; Unauthorized when none."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT id, name, deleted_at FROM computers WHERE token_hash = ?",
                (hash_token(token),),
            ).fetchone()
        if row is None:
            raise Unauthorized(
                "the computer token is not valid; check the credential you were given"
            )
        if row["deleted_at"] is not None:
            raise Unauthorized(revoked_reason(row["name"], row["deleted_at"]))
        return str(row["id"])

    def agent_by_token(self, token: str, turn_secret: str | None = None) -> AgentIdentity:
        """The agent an agent token belongs to, while its Computer still hosts it, and the
        turn its write belongs to (the one `turn_secret` names, else its latest)."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT t.agent_id, a.handle, t.computer_id FROM agent_tokens t "
                "JOIN agents a ON a.id = t.agent_id AND a.computer_id = t.computer_id "
                "WHERE t.token_hash = ?",
                (hash_token(token),),
            ).fetchone()
            if row is None:
                raise Unauthorized(
                    "the agent token is not valid (it expires when the Computer reconnects)"
                )
            turn_id = bound_turn(tx, row["agent_id"], turn_secret, self.clock.now())
        return AgentIdentity(row["agent_id"], row["handle"], row["computer_id"], turn_id)

    # ------------------------------------------------------------------ computers

    def create_computer(self, name: str) -> tuple[str, str]:
        """A new Computer credential: (computer_id, token). The token is shown only now."""
        computer_id, token = new_id(), new_token("crc")
        with self._database.write() as tx:
            tx.execute(
                "INSERT INTO computers (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)",
                (computer_id, name, hash_token(token), tx.now()),
            )
        return computer_id, token

    def list_computers(self) -> list[dict[str, Any]]:
        """Every Computer with what it last reported (connect, models)."""
        with self._database.read() as tx:
            rows = tx.execute(
                "SELECT id, name, epoch, hostname, platform, version, capacity, models, connected_at "
                "FROM computers WHERE deleted_at IS NULL ORDER BY created_at, id"
            ).fetchall()
        return [{**dict(r), "models": orjson.loads(r["models"])} for r in rows]

    def connect(
        self, computer_id: str, hostname: str, platform: str, version: str, capacity: int
    ) -> dict[str, Any]:
        """A new connection epoch; turns of older connections become interrupted."""
        with self._database.write() as tx:
            now = tx.now()
            epoch = tx.execute(
                "UPDATE computers SET epoch = epoch + 1, hostname = ?, platform = ?, version = ?, "
                "capacity = ?, connected_at = ? WHERE id = ? RETURNING epoch",
                (hostname, platform, version, capacity, now, computer_id),
            ).fetchone()["epoch"]
            lost = tx.execute(
                "UPDATE turns SET status = 'interrupted', finished_at = ? "
                "WHERE computer_id = ? AND status = 'running' AND fence < ? "
                "RETURNING id, agent_id",
                (now, computer_id, epoch),
            ).fetchall()
            # The Computer vanished mid-turn (kill -9): rooms those turns answered are
            # read, before the new connection claims anything.
            for turn in lost:
                ack_answered_rooms(tx, str(turn["agent_id"]), str(turn["id"]))
            # Nobody can answer for those turns any more (issue 24).
            close_turn_approvals(tx, [str(turn["id"]) for turn in lost], RECONNECTED)
            interrupted = len(lost)
            tx.execute(
                "DELETE FROM agent_tokens WHERE computer_id = ? AND epoch < ?", (computer_id, epoch)
            )
        if interrupted:
            log.info(
                "computer %s connected (epoch %d): %d turns interrupted",
                computer_id,
                epoch,
                interrupted,
            )
        return {"computer_id": computer_id, "epoch": epoch, "server_time": now}

    def set_models(self, computer_id: str, models: list[str]) -> None:
        """Record the models a Computer can run."""
        with self._database.write() as tx:
            tx.execute(
                "UPDATE computers SET models = ? WHERE id = ?",
                (orjson.dumps(models).decode(), computer_id),
            )

    # ------------------------------------------------------------------ agents

    def create_agent(
        self,
        handle: str,
        name: str,
        persona: str,
        model: str,
        engine: str,
        computer_id: str | None,
        turn_time_limit_s: int | None = None,
        egress: dict[str, Any] | None = None,
        budget: Any = None,
        permission: dict[str, Any] | None = None,
        capabilities: Any = None,
    ) -> dict[str, Any]:
        """A new agent; its Computer (if any) hears `agents`. Handles are unique; a model
        its Computer did not report is refused (`check_model`), so is an egress policy
        that cannot be read (`stored_egress`; None: the default), a budget that cannot
        (`stored_budget`; None: no budget), a permission policy (`stored_permission`)
        and capabilities (`stored_capabilities`; None: none). The agent comes with `warnings` (e.g. the model could not be checked)."""
        agent_id = new_id()
        policy = stored_egress(egress)
        caps = stored_budget(budget)
        permission_policy = stored_permission(permission)
        capability_document = stored_capabilities(capabilities)
        with self._database.write() as tx:
            check_computer(tx, computer_id)
            if tx.execute("SELECT 1 FROM agents WHERE handle = ?", (handle,)).fetchone():
                raise Conflict(f"the handle @{handle} is taken; choose another handle")
            warnings = check_model(tx, model, computer_id)
            tx.execute(
                "INSERT INTO agents (id, handle, name, persona, engine, model, computer_id, "
                "turn_time_limit_s, egress, budget, permission, capabilities, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    agent_id,
                    handle,
                    name,
                    persona,
                    engine,
                    model,
                    computer_id,
                    turn_time_limit_s,
                    policy,
                    caps,
                    permission_policy,
                    capability_document,
                    tx.now(),
                ),
            )
            if computer_id is not None:
                tx.emit(computer_id, "agents", {"agent_id": agent_id})
        return {**self.get_agent(agent_id), "warnings": warnings}

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        """One agent (without status)."""
        with self._database.read() as tx:
            row = tx.execute(
                f"SELECT {AGENT_COLS} FROM agents WHERE id = ? AND deleted_at IS NULL", (agent_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"no agent {agent_id}")
        return agent_of(row)

    def update_agent(self, agent_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change an agent's settings; its Computer (old and new) hears `agents`.

        A new model, or a new Computer, is checked as at creation (`check_model`), a new
        egress policy too (`stored_egress`: it replaces the whole policy), a new budget too
        (`stored_budget`: it replaces the whole budget, and wakes the agent: a raised cap
        answers its waiting messages at once), a new permission policy as well
        (`stored_permission`, the whole policy); the agent comes with `warnings`.
        """
        allowed = {
            "name",
            "persona",
            "model",
            "engine",
            "computer_id",
            "turn_time_limit_s",
            "egress",
            "budget",
            "permission",
            "capabilities",
        }
        fields = {k: v for k, v in changes.items() if k in allowed}
        if "egress" in fields:
            fields["egress"] = stored_egress(fields["egress"])
        if "budget" in fields:
            fields["budget"] = stored_budget(fields["budget"])
        if "permission" in fields:
            fields["permission"] = stored_permission(fields["permission"])
        warnings: list[str] = []
        with self._database.write() as tx:
            row = tx.execute(
                "SELECT computer_id, model, capabilities FROM agents "
                "WHERE id = ? AND deleted_at IS NULL",
                (agent_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no agent {agent_id}")
            if "capabilities" in fields:
                # The whole document, as PUT .../capabilities ("(set)" keeps a secret).
                fields["capabilities"] = stored_capabilities(
                    fields["capabilities"], read_capabilities(row["capabilities"])
                )
            old_computer = row["computer_id"]
            if "computer_id" in fields:
                check_computer(tx, fields["computer_id"])
            if "model" in fields or "computer_id" in fields:
                warnings = check_model(
                    tx, fields.get("model", row["model"]), fields.get("computer_id", old_computer)
                )
            if fields:
                sets = ", ".join(f"{k} = ?" for k in fields)
                tx.execute(f"UPDATE agents SET {sets} WHERE id = ?", [*fields.values(), agent_id])
            if "budget" in fields:
                # Its claim checks the new caps; held messages are answered at once.
                tx.execute("UPDATE agents SET budget_held_until = NULL WHERE id = ?", (agent_id,))
                tx.wake([agent_id])
            new_computer = fields.get("computer_id", old_computer)
            for computer_id in {old_computer, new_computer} - {None}:
                tx.emit(computer_id, "agents", {"agent_id": agent_id})
        return {**self.get_agent(agent_id), "warnings": warnings}

    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent with its status (derived from its latest turn; `budget` while a
        reached cap holds its turns), problem and budget state."""
        with self._database.read() as tx:
            rows = tx.execute(
                f"SELECT {AGENT_COLS}, problem, budget_extra_turns, "
                "(SELECT status FROM turns t WHERE t.agent_id = agents.id "
                " ORDER BY started_at DESC, rowid DESC LIMIT 1) AS last_status "
                "FROM agents WHERE deleted_at IS NULL ORDER BY handle"
            ).fetchall()
            states = {
                r["id"]: budget_state(tx, r["id"], r["budget"], r["budget_extra_turns"])
                for r in rows
            }
        return [
            {
                **agent_of(r),
                "status": rules.agent_status(r["last_status"], states[r["id"]]),
                "problem": r["problem"],
                "budget_state": states[r["id"]],
            }
            for r in rows
        ]

    def computer_agents(self, computer_id: str) -> list[dict[str, Any]]:
        """The agents assigned to a Computer, by handle, each with its capabilities
        (secrets in clear: the Computer materialises them) and their version."""
        with self._database.read() as tx:
            rows = tx.execute(
                f"SELECT {AGENT_COLS}, capabilities FROM agents WHERE computer_id = ? "
                "ORDER BY handle",
                (computer_id,),
            ).fetchall()
        return [{**agent_of(r), **synced(r["capabilities"])} for r in rows]

    def set_problem(self, computer_id: str, agent_id: str, reason: str | None) -> None:
        """Set (or with None clear) why an agent of this Computer cannot run."""
        with self._database.write() as tx:
            own_agent(tx, computer_id, agent_id)
            tx.execute("UPDATE agents SET problem = ? WHERE id = ?", (reason, agent_id))

    def current_epoch(self, computer_id: str) -> int:
        """The epoch of the Computer's newest connection (0: never connected)."""
        with self._database.read() as tx:
            return connection_epoch(tx, computer_id, None)

    def check_epoch(self, computer_id: str, epoch: int) -> None:
        """Raise `Superseded` when a newer connection of this Computer exists."""
        with self._database.read() as tx:
            connection_epoch(tx, computer_id, epoch)

    def issue_agent_token(self, computer_id: str, agent_id: str, epoch: int | None = None) -> str:
        """A new token for an agent of this Computer, valid until the Computer reconnects.

        The token belongs to the caller's connection (`epoch`): a superseded Computer
        gets `Superseded`, never a token of the connection that replaced it.
        """
        token = new_token("cra")
        with self._database.write() as tx:
            own_agent(tx, computer_id, agent_id)
            epoch = connection_epoch(tx, computer_id, epoch)
            tx.execute(
                "INSERT INTO agent_tokens VALUES (?, ?, ?, ?, ?)",
                (hash_token(token), agent_id, computer_id, epoch, tx.now()),
            )
        return token
