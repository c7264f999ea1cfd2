"""Everything a turn's engine is given, computed before its first attempt (computer.md §3).

The Computer computes it all — the exact environment (nothing inherited),
the derived OpenCode config, the host-loopback ports the sandbox reaches, the
price table copied into the agent's cache — and both ways of running the
turn get exactly this (`PreparedTurn`): a warm server is started with the
same environment a cold run gets. The user's login for the turn's provider
goes to the model gateway (`computer_service/gateway/`), never to the
engine: the engine's config points the provider at the agent's gateway port
(forwarded like the crew server's) and its auth and config carry only the
agent's placeholder (`gateway.engine_view`). What must never show in a
reason (credentials, the agent's token) is collected into the turn's
`secrets` on the way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from computer_service import safe_fs
from computer_service.engine.attempt import stopped_result
from computer_service.engine.base import (
    Failure,
    FailureClass,
    StopSignal,
    TurnRequest,
    TurnResult,
    Usage,
)
from computer_service.engine.capabilities import (
    mcp_routes,
    opencode_settings,
    skill_files,
)
from computer_service.engine.capabilities import secrets as capability_secrets
from computer_service.engine.failures import model_id_failure
from computer_service.engine.loopback_ports import sandbox_loopback_ports
from computer_service.engine.opencode_env import engine_env, opencode_config
from computer_service.engine.user_opencode import (
    KEYLESS_PROVIDERS,
    NotLoggedIn,
    UserOpenCode,
    auth_for_provider,
    auth_secrets,
    config_secrets,
    read_auth,
    read_user_providers,
)
from computer_service.gateway.access import GatewayAccess
from computer_service.gateway.engine_view import engine_auth, engine_provider
from computer_service.gateway.forward import Route
from computer_service.gateway.gateway import Gateway
from computer_service.gateway.logins import KeyLogin, Login
from computer_service.gateway.oauth import BEARER_BETAS, OAuthLogin
from computer_service.gateway.upstream import upstream_base
from computer_service.gateway.warm_up import TWIN_PROVIDER, WarmUpTwin, twin_provider
from computer_service.home import write_skills
from computer_service.safe_fs import UnsafePath
from crew_common.egress import EgressPolicy
from crew_common.launcher_wire import DEFAULT_STDOUT_LIMIT
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)

PRICE_TABLE_LIMIT = 32 * 1024 * 1024


@dataclass(frozen=True)
class PreparedTurn:
    """One turn, ready to run: what its engine process (or server) is given."""

    request: TurnRequest
    paths: AgentPaths
    env: dict[str, str]
    ports: list[int]  # the host-loopback ports forwarded into the sandbox
    bin_dir: Path
    interpreter_dirs: list[str]
    stdout_limit: int
    secrets: list[str]
    egress: EgressPolicy = field(default_factory=EgressPolicy)  # the request's, to the launcher
    # `OPENCODE_CONFIG_CONTENT` with the policy's asks kept, for an engine that can put them
    # to a person (the warm server); `env` has them as `deny` (a cold `opencode run --auto`
    # would answer every ask `once`). None: the policy never asks, `env` is the same.
    asking_config: str | None = None
    # The prewarm's warm-up model (a twin of the turn's provider the gateway answers
    # itself: `gateway.warm_up`); None: the turn's provider has no twin.
    warm_up: WarmUpTwin | None = None

    def asking_env(self) -> dict[str, str]:
        """The environment of an engine that asks the person (`asking_config`)."""
        if self.asking_config is None:
            return self.env
        return {**self.env, "OPENCODE_CONFIG_CONTENT": self.asking_config}


class Preparation:
    """Prepares each turn of this Computer's agents (module doc)."""

    def __init__(
        self,
        *,
        crew_home: Path,
        run_id: str,
        server_url: str,
        bin_dir: Path,
        interpreter_dirs: list[Path] | None = None,
        loopback_ports: list[int] | None = None,
        user: UserOpenCode | None = None,
        base_path: str | None = None,
        lang: str | None = None,
        stdout_limit: int = DEFAULT_STDOUT_LIMIT,
        environ: Mapping[str, str] | None = None,
        gateway: Gateway | None = None,
    ) -> None:
        self.crew_home = crew_home
        self.run_id = run_id
        self.server_url = server_url
        self.bin_dir = bin_dir
        self.interpreter_dirs = [str(p) for p in interpreter_dirs or []]
        self.loopback_ports = loopback_ports or []  # the bootstrap's extra forwarded ports
        self.user = user or UserOpenCode.from_env(os.environ)
        self.base_path = base_path if base_path is not None else os.environ.get("PATH", os.defpath)
        self.lang = lang or os.environ.get("LANG") or "C.UTF-8"
        self.stdout_limit = stdout_limit
        # Where `{env:VAR}` in the user's provider config is looked up (never passed on whole).
        self.environ = os.environ if environ is None else environ
        self.gateway = gateway or Gateway()

    def paths(self, agent_id: str) -> AgentPaths:
        return AgentPaths(crew_home=self.crew_home, run_id=self.run_id, agent_id=agent_id)

    def secrets(self, paths: AgentPaths) -> list[str]:
        """What no reason may show of any turn of this agent (more is added by `prepare`)."""
        return [str(paths.agent_dir), str(paths.runtime_dir), str(self.crew_home)]

    async def prepare(
        self, request: TurnRequest, stop: StopSignal, paths: AgentPaths, secrets: list[str]
    ) -> PreparedTurn | TurnResult:
        """The turn ready to run, or the result that ends it early.

        Adds what must never show in a reason (credentials, the agent's token) to `secrets`.
        """
        if stop.is_set():
            return stopped_result(None, Usage())
        if (bad_model := model_id_failure(request.model)) is not None:
            return TurnResult("failed", bad_model)
        provider = request.model.split("/", 1)[0]
        # Resolved here: the engine gets none of our environment and none of the user's files.
        providers = await anyio.to_thread.run_sync(
            read_user_providers, self.user.config_files, self.environ
        )
        try:
            auth = await anyio.to_thread.run_sync(read_auth, self.user.auth_file)
        except NotLoggedIn as exc:
            # A provider the user configured (its key in the config or none needed) runs
            # without; so does one OpenCode runs keyless (`KEYLESS_PROVIDERS`).
            configured = providers is not None and provider in providers
            if not configured and provider not in KEYLESS_PROVIDERS:
                return TurnResult("failed", Failure(FailureClass.NOT_LOGGED_IN, str(exc)))
            auth = "{}"
        # Only the login of this turn's provider: the agent never sees the others.
        auth = auth_for_provider(auth, provider)
        secrets += auth_secrets(auth)
        if providers:
            secrets += config_secrets(providers)
        section = (providers or {}).get(provider)
        base = await anyio.to_thread.run_sync(
            upstream_base, provider, section, self.user.price_table
        )
        entry = orjson.loads(auth).get(provider)
        access = await self.gateway.access_for(request.agent_id)
        login = self._login(provider, entry, section)
        self.gateway.route(
            request.agent_id,
            provider,
            Route(
                base,
                login,
                _configured_headers(section),
                bearer_beta=BEARER_BETAS.get(provider) if isinstance(login, OAuthLogin) else None,
            ),
        )
        try:
            token = safe_fs.read_regular_file(self.crew_home, paths.token_file, 4096)
        except UnsafePath as exc:
            log.warning("agent %s: cannot read its token for redaction: %s", request.agent_id, exc)
            token = None
        if token:
            secrets.append(token.decode("utf-8", "replace").strip())
        await anyio.to_thread.run_sync(copy_price_table, paths, self.user.price_table)
        if stop.is_set():
            return stopped_result(None, Usage())
        engine_providers = engine_provider(section, provider, access)
        model_id = request.model.split("/", 1)[1]
        twin = (
            None
            if provider == TWIN_PROVIDER
            else twin_provider(section, provider, model_id, access)
        )
        if twin is not None:
            engine_providers.update(twin)
        capabilities = await self._capabilities(request, paths, access, secrets)
        if isinstance(capabilities, TurnResult):
            return capabilities
        policy = request.permission
        env = engine_env(
            paths,
            bin_dir=self.bin_dir,
            server_url=self.server_url,
            auth_content=engine_auth(entry, provider, access.placeholder),
            config_content=opencode_config(
                paths.agents_md,
                request.model,
                engine_providers,
                policy.to_opencode(can_ask=False),
                capabilities,
            ),
            base_path=self.base_path,
            lang=self.lang,
        )
        asking_config = None
        if policy.asks():
            asking_config = opencode_config(
                paths.agents_md,
                request.model,
                engine_providers,
                policy.to_opencode(can_ask=True),
                capabilities,
            )
        return PreparedTurn(
            request=request,
            paths=paths,
            env=env,
            ports=sorted({*await self.forwarded_ports(), access.port}),
            bin_dir=self.bin_dir,
            interpreter_dirs=self.interpreter_dirs,
            stdout_limit=self.stdout_limit,
            secrets=secrets,
            egress=request.egress,
            asking_config=asking_config,
            warm_up=(
                WarmUpTwin(
                    f"{TWIN_PROVIDER}/{model_id}", self.gateway.warm_up_gate(request.agent_id)
                )
                if twin is not None
                else None
            ),
        )

    async def _capabilities(
        self, request: TurnRequest, paths: AgentPaths, access: GatewayAccess, secrets: list[str]
    ) -> dict[str, Any] | TurnResult:
        """The agent's MCP servers and skills made ready (`engine.capabilities`): the skill
        files written, the gateway's MCP routes set, the secrets added to `secrets`; the
        `mcp`/`skills` settings of the engine's config, or the result that ends the turn."""
        caps = request.capabilities
        secrets += capability_secrets(caps)
        self.gateway.mcp_routes(request.agent_id, mcp_routes(caps))
        try:
            files = skill_files(caps)
            skills_dir = await anyio.to_thread.run_sync(write_skills, paths, files)
        except (ValueError, UnsafePath, OSError) as exc:
            reason = f"the agent's skills could not be written: {exc}"
            return TurnResult("failed", Failure(FailureClass.SANDBOX, reason))
        return opencode_settings(
            caps,
            gateway_port=access.port,
            placeholder=access.placeholder,
            skills_dir=str(skills_dir) if skills_dir is not None else "",
        )

    def _login(self, provider: str, entry: Any, section: Any) -> Login:
        """The real credential the gateway puts into the turn's calls to `provider`.

        The config's own `apiKey` (its `{env:}`/`{file:}` resolved) first, as
        OpenCode merges it over the login; then auth.json's entry.
        """
        options = section.get("options") if isinstance(section, dict) else None
        key = options.get("apiKey") if isinstance(options, dict) else None
        if isinstance(key, str) and key:
            return KeyLogin(key)
        if isinstance(entry, dict):
            if entry.get("type") == "oauth":
                return self.gateway.oauth_login(self.user.auth_file, provider)
            found = entry.get("key") if entry.get("type") == "api" else None
            found = found or entry.get("key") or entry.get("token")
            if isinstance(found, str) and found:
                return KeyLogin(found)
        # OpenCode's own keyless providers send the key "public" (user_opencode).
        return KeyLogin("public" if provider in KEYLESS_PROVIDERS else None)

    async def forwarded_ports(self) -> list[int]:
        """The host-loopback ports this Computer's sandboxes reach: crew server, local models."""
        providers = await anyio.to_thread.run_sync(
            read_user_providers, self.user.config_files, self.environ
        )
        return sandbox_loopback_ports(self.server_url, providers, self.loopback_ports)


def _configured_headers(section: Any) -> dict[str, str]:
    """The headers the user's config sets for the provider: the gateway sends them."""
    options = section.get("options") if isinstance(section, dict) else None
    headers = options.get("headers") if isinstance(options, dict) else None
    if not isinstance(headers, dict):
        return {}
    return {str(k): v for k, v in headers.items() if isinstance(v, str)}


def copy_price_table(paths: AgentPaths, source: Path) -> bool:
    """Copy the user's OpenCode price table into the agent's cache dir when newer.

    Returns True when copied. Never raises: a failed copy only costs the turn
    its prices (cost 0), so it is logged and the turn goes on.
    """
    dest = paths.cache_dir / "opencode" / "models.json"
    try:
        return safe_fs.copy_if_newer(source, paths.crew_home, dest, PRICE_TABLE_LIMIT)
    except (UnsafePath, OSError) as exc:
        log.warning("agent %s: price table not copied (costs will read 0): %s", paths.agent_id, exc)
        return False
