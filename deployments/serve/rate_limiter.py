"""The rate limiter's one home on a cluster: an actor holding every pool
(``deployments.runtime.rate_limit.ResourcePools``), and each model replica's gate to it.

With ``--rate-limit=execution_count`` a replica whose instance group lists ``rate_limiter``
resources asks the actor before each execution and gives the grant back after. The server
application starts the actor and holds it (every replica finds it by name); where it is gone (the
server application restarting), the next replica to ask starts another, with no grant held. Every second
the actor asks each replica holding or waiting for resources whether it is alive: a replica that
died holding resources gives them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from deployments.backends.python_api.logger import log_to_stderr
from deployments.runtime.rate_limit import Needs, ResourcePools, instance_needs
from deployments.serve import hooks
from deployments.settings import LogSettings, ResourceLimit, ServerSettings
from repository_loader.model import InstanceGroup

logger = logging.getLogger(__name__)

ACTOR_NAME = "triton-rate-limiter"
WATCH_S = 1.0  # how often the actor checks that the holders it serves are alive


class RateLimiterActor:
    """Every pool of the server (an async actor: grants are answered as resources come back)."""

    def __init__(self, limits: list[str], log_settings: LogSettings | None = None) -> None:
        settings = log_settings or LogSettings()
        log_to_stderr(settings)  # the server's log flags, as in every replica
        self.pools = ResourcePools(tuple(ResourceLimit.parse(t) for t in limits))
        self._handles: dict[str, Any] = {}
        self._watch: asyncio.Task[None] | None = None
        self._verbose = settings.verbose_level
        self._logged: dict[str, list[int]] = {}

    def _log_pools(self) -> None:
        """With ``--log-verbose``, each pool's copies as they change, in Triton's words."""
        if self._verbose < 1:
            return
        now = self.state()
        for pool, (_, capacity) in sorted(now.items()):
            if self._logged.get(pool, [0, None])[1] != capacity:
                name, _, scope = pool.partition("@")
                logger.info("Rate limiter pool %s: Resource: %s\t Count: %d", scope, name, capacity)
        self._logged = now

    def register(self, holder: str, needs: Needs, handle: Any) -> None:
        self.pools.register(holder, needs)
        self._log_pools()
        if handle is not None:
            self._handles[holder] = handle
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_holders())

    async def acquire(self, holder: str, needs: Needs) -> int:
        return await self.pools.acquire(holder, needs)

    def release(self, grant: int) -> None:
        self.pools.release(grant)

    def state(self) -> dict[str, Any]:
        """Pools in use now (for tests and operators): ``{"<name>@<scope>": [in use, capacity]}``."""
        pools = self.pools
        return {f"{n}@{s}": [pools.in_use((n, s)), pools.capacity((n, s))] for n, s in sorted(pools.keys())}

    def forget(self, holder: str) -> None:
        self._handles.pop(holder, None)
        self.pools.forget(holder)
        self._log_pools()

    async def _watch_holders(self) -> None:
        """Every :data:`WATCH_S`, ask every registered instance (idle ones included: a gone one would
        otherwise keep sizing its pools, where Triton sizes them by the instances there are) whether
        it is alive, all at once; a gone one's grants go back and it stops counting."""
        while True:
            await asyncio.sleep(WATCH_S)
            watched = [(h, self._handles[h]) for h in sorted(self.pools.registered()) if h in self._handles]
            gone = await asyncio.gather(*(hooks.actor_gone(handle, WATCH_S * 5) for _, handle in watched))
            for (holder, _), dead in zip(watched, gone, strict=True):
                if dead:
                    logger.warning("rate limiter: instance %s is gone; its resources go back", holder)
                    self.forget(holder)


def limiter_actor(settings: ServerSettings) -> Any:
    """The server's rate-limiter actor: the running one, or a new one where none runs."""
    import ray

    from deployments.serve.spare import child_runtime_env

    remote = ray.remote(num_cpus=0)(RateLimiterActor)  # an async actor: grants wait side by side
    env = child_runtime_env(None)  # not the server's own: its spare worker is for the server's replica
    options: dict[str, Any] = {} if env is None else {"runtime_env": env}
    return remote.options(name=ACTOR_NAME, get_if_exists=True, **options).remote(  # type: ignore[attr-defined]
        [limit.to_text() for limit in settings.rate_limit_resources], settings.log_settings
    )


class RateGate:
    """One replica's gate: ``async with gate.execution():`` holds its group's resources for one
    execution. Where the actor cannot be reached, the execution goes on unlimited and says so once."""

    def __init__(self, settings: ServerSettings, holder: str, needs: Needs) -> None:
        self.settings = settings
        self.holder = holder
        self.needs = needs
        self._actor: Any = None
        self._warned = False

    async def _ready(self) -> Any:
        if self._actor is None:
            import ray

            actor = await asyncio.to_thread(limiter_actor, self.settings)
            context = ray.get_runtime_context()
            handle = context.current_actor if context.get_actor_id() else None
            await actor.register.remote(self.holder, self.needs, handle)
            self._actor = actor
        return self._actor

    @contextlib.asynccontextmanager
    async def execution(self) -> AsyncIterator[None]:
        grant = None
        actor = None
        for attempt in (1, 2):  # once more with a new actor where the last one is gone
            try:
                actor = await self._ready()
                grant = await actor.acquire.remote(self.holder, self.needs)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._actor = None
                if attempt == 2 and not self._warned:
                    self._warned = True
                    logger.warning("rate limiter not reached (%s): executing without it", exc)
        try:
            yield
        finally:
            if grant is not None and actor is not None:
                with contextlib.suppress(Exception):
                    actor.release.remote(grant)


def rate_gate(settings: ServerSettings, group: InstanceGroup, holder: str, device: int) -> RateGate | None:
    """The gate of a replica of ``group`` on ``device`` (None where nothing is limited)."""
    if settings.rate_limit != "execution_count" or not group.rate_limiter.resources:
        return None
    import ray

    node = ray.get_runtime_context().get_node_id()
    needs = instance_needs(group.rate_limiter, node, device)
    return RateGate(settings, holder, needs) if needs.resources else None
