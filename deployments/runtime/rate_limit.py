"""Triton's rate limiter (``--rate-limit=execution_count``, docs/rate_limiter.md), without Ray.

An instance whose group lists ``rate_limiter`` resources executes only while it holds that many
copies of each; it takes them when an execution starts and gives them back when it ends. A
resource has one pool per device (per node and device here: a node's devices are its own) or, when
the model marks it ``global``, one pool for the server. A pool has the copies
``--rate-limit-resource`` gives it, else the most any registered instance needs of it, so that every
instance can run alone. Waiting instances are served by weight: each grant adds the instance's
``priority`` (at least 1) to what it was given, and the instance given the least goes first; the
first in line is never passed over by a smaller request, so none waits for ever.

:class:`ResourcePools` is that bookkeeping for every replica of the server;
``deployments.serve.rate_limiter`` holds it in one actor and gives each replica its gate.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from deployments.settings import ResourceLimit
from repository_loader.errors import InvalidArgument
from repository_loader.model import InstanceGroup, InstanceKind, ModelDescription, RateLimiter

GLOBAL = "global"
Key = tuple[str, str]
"""A pool: (resource name, :data:`GLOBAL` or ``"<node>:<device>"``)."""


@dataclass(frozen=True)
class Needs:
    """What one instance takes from the pools for each execution, and its weight among waiters."""

    resources: tuple[tuple[Key, int], ...]
    priority: int = 1


def instance_needs(limiter: RateLimiter, node: str, device: int) -> Needs:
    """The :class:`Needs` of an instance of a group with ``limiter`` on ``device`` of ``node``."""
    resources = tuple(
        ((r.name, GLOBAL if r.global_ else f"{node}:{device}"), r.count) for r in limiter.resources if r.count
    )
    return Needs(resources, max(limiter.priority, 1))


def limit_for(limits: Iterable[ResourceLimit], name: str, device: int | None) -> int | None:
    """The copies ``--rate-limit-resource`` gives resource ``name`` on ``device`` (None: a global
    resource, or a device not known yet): a device's own value first, then the one for every device."""
    every = None
    for limit in limits:
        if limit.name != name:
            continue
        if limit.device is None:
            every = limit.count
        elif device is not None and limit.device == device:
            return limit.count
    return every


def _devices(group: InstanceGroup) -> tuple[int | None, ...]:
    if group.kind == InstanceKind.GPU:
        return tuple(group.gpus) or (None,)
    return (0,)


def check_limits(model: ModelDescription, limits: tuple[ResourceLimit, ...]) -> None:
    """Refuse ``model`` when an instance of it needs more of a resource than ``--rate-limit-resource``
    gives: it could never execute."""
    for group in model.instance_groups:
        for resource in group.rate_limiter.resources:
            devices = (None,) if resource.global_ else _devices(group)
            for device in devices:
                given = limit_for(limits, resource.name, None if resource.global_ else device)
                if given is not None and given < resource.count:
                    raise InvalidArgument(
                        f"model '{model.name}': resource count for '{resource.name}' is limited to {given} "
                        "which will prevent scheduling of one or more model instances, the minimum "
                        f"required count is {resource.count}"
                    )


@dataclass
class _Waiter:
    order: tuple[int, int]
    holder: str
    needs: Needs
    granted: asyncio.Future[int] = field(repr=False)


class ResourcePools:
    """Every pool of the server, the grants held and the instances waiting (one event loop's)."""

    def __init__(self, limits: tuple[ResourceLimit, ...] = ()) -> None:
        self.limits = limits
        self._registered: dict[str, Needs] = {}
        self._held: dict[Key, int] = {}
        self._grants: dict[int, tuple[str, Needs]] = {}
        self._waiting: list[_Waiter] = []
        self._given: dict[str, int] = {}  # weighted grants per holder
        self._ids = itertools.count(1)
        self._seq = itertools.count()

    def register(self, holder: str, needs: Needs) -> None:
        """``holder`` (an instance) needs ``needs``: the default size of its pools counts it."""
        self._registered[holder] = needs
        if holder not in self._given:  # a newcomer starts level with those already served
            self._given[holder] = min(self._given.values(), default=0)
        self._grant()

    def forget(self, holder: str) -> None:
        """``holder`` is gone: its grants go back and its waits end."""
        self._registered.pop(holder, None)
        self._given.pop(holder, None)
        for waiter in [w for w in self._waiting if w.holder == holder]:
            self._waiting.remove(waiter)
            waiter.granted.cancel()
        for grant, (owner, _) in list(self._grants.items()):
            if owner == holder:
                self.release(grant)
        self._grant()

    def capacity(self, key: Key) -> int:
        name, scope = key
        device = None if scope == GLOBAL else int(scope.rpartition(":")[2])
        given = limit_for(self.limits, name, device)
        if given is not None:
            return given
        return max((c for n in self._registered.values() for k, c in n.resources if k == key), default=0)

    def keys(self) -> set[Key]:
        """Every pool some registered instance uses."""
        return {key for needs in self._registered.values() for key, _ in needs.resources}

    def in_use(self, key: Key) -> int:
        return self._held.get(key, 0)

    def registered(self) -> set[str]:
        """Every instance registered, idle ones included (each counts toward its pools' default size)."""
        return set(self._registered)

    def holders(self) -> set[str]:
        """Instances that hold or wait for resources now."""
        return {owner for owner, _ in self._grants.values()} | {w.holder for w in self._waiting}

    async def acquire(self, holder: str, needs: Needs) -> int:
        """Wait until ``holder`` may execute; the grant's id, for :meth:`release`."""
        if holder not in self._registered:
            self.register(holder, needs)
        loop = asyncio.get_running_loop()
        waiter = _Waiter((self._given.get(holder, 0), next(self._seq)), holder, needs, loop.create_future())
        self._waiting.append(waiter)
        self._grant()
        try:
            return await asyncio.shield(waiter.granted)
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
                self._grant()
            elif waiter.granted.done() and not waiter.granted.cancelled():
                self.release(waiter.granted.result())  # granted as the caller left
            raise

    def release(self, grant: int) -> None:
        """The execution of ``grant`` ended: its resources go back (an unknown grant is ignored)."""
        taken = self._grants.pop(grant, None)
        if taken is None:
            return
        for key, count in taken[1].resources:
            self._held[key] = self._held.get(key, 0) - count
        self._grant()

    def _fits(self, needs: Needs) -> bool:
        return all(self.in_use(key) + count <= self.capacity(key) for key, count in needs.resources)

    def _grant(self) -> None:
        self._waiting.sort(key=lambda w: w.order)
        while self._waiting and self._fits(self._waiting[0].needs):
            waiter = self._waiting.pop(0)
            if waiter.granted.done():  # cancelled meanwhile
                continue
            grant = next(self._ids)
            for key, count in waiter.needs.resources:
                self._held[key] = self._held.get(key, 0) + count
            self._grants[grant] = (waiter.holder, waiter.needs)
            self._given[waiter.holder] = self._given.get(waiter.holder, 0) + waiter.needs.priority
            waiter.granted.set_result(grant)
