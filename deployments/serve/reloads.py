"""Reloading a serving model without a moment unserved: a two-phase swap inside its replicas.

Serve's own redeploy of a one-replica application stops the old replica before the new
one starts (its rolling update never exceeds the target count), so requests fail in
between. Where the new description runs on the same replicas (same count, kind and
resources; ``RayDeployer.reload`` checks), the server application instead posts an
order that every replica of the model follows:

1. **prepare**: each replica loads the new description beside the one it serves (every
   version, warmup included) and reports success or the reason it failed;
2. **commit** when every replica prepared: each swaps to the new runtime (requests
   already running finish on the old one, which is then closed) and acknowledges;
   **abort** when one failed or the time ran out: each drops what it prepared, and
   the old description keeps serving.

Replicas long-poll the server for orders (:meth:`ReloadBoard.wait`); a replica that
starts later (Serve replaced one) finds the last committed order and applies it before
anything else.

A count-only change scales the model's deployments in place (``RayDeployer.reload``): the
replicas that stay were built from the old description, so a **describe** order hands them
the new one, which differs only in its instance counts (what the model's config reports);
nothing is loaded again. Plain asyncio, no Ray: the server deployment and the model deployment
call it through their handles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from deployments.runtime.broadcast import Broadcast
from deployments.serve.server_api import ServerClient
from repository_loader.errors import Unavailable
from repository_loader.model import ModelDescription

logger = logging.getLogger("ray.serve")

PREPARE, COMMIT, ABORT, DESCRIBE = "prepare", "commit", "abort", "describe"


@dataclass(frozen=True)
class Order:
    generation: int
    phase: str
    model: ModelDescription
    composing: dict[str, ModelDescription] | None = None
    replicas: int = 0  # DESCRIBE: how many replicas the model has now (over all its instance groups)

    @property
    def key(self) -> tuple[int, str]:
        return self.generation, self.phase


@dataclass
class _Reports:
    prepared: dict[str, str | None] = field(default_factory=dict)  # replica -> error (None: ok)
    committed: set[str] = field(default_factory=set)


class ReloadBoard:
    """The server side: the current order of each model and the replicas' reports."""

    def __init__(self) -> None:
        self._orders: dict[str, Order] = {}  # the in-flight order, else the last committed one
        self._committed: dict[str, Order] = {}
        self._reports: dict[tuple[str, int], _Reports] = {}
        self._changes = Broadcast()  # wakes every waiter, from any thread
        self._generation = 0

    def current(self, name: str) -> Order | None:
        return self._orders.get(name)

    async def wait(self, name: str, seen: tuple[int, str], timeout_s: float) -> Order | None:
        """The model's order once it differs from ``seen``; None after ``timeout_s`` without one.
        A replica that has seen nothing gets the last committed order first."""
        committed = self._committed.get(name)
        if tuple(seen)[0] == 0 and committed is not None:
            return committed
        await self._until(lambda: self._differs(name, seen), time.monotonic() + timeout_s)
        return self._orders.get(name) if self._differs(name, seen) else None

    def _differs(self, name: str, seen: tuple[int, str]) -> bool:
        order = self._orders.get(name)
        return order is not None and order.key != tuple(seen)

    async def report(self, name: str, generation: int, replica: str, phase: str, error: str | None) -> None:
        reports = self._reports.setdefault((name, generation), _Reports())
        if phase == PREPARE:
            reports.prepared[replica] = error
        elif phase in (COMMIT, DESCRIBE):
            reports.committed.add(replica)
        self._notify()

    async def _post(self, order: Order) -> None:
        self._orders[order.model.name] = order
        self._notify()

    def _notify(self) -> None:
        self._changes.notify()

    async def _until(self, check: Callable[[], bool], deadline: float) -> bool:
        return await self._changes.until(check, deadline - time.monotonic())

    def forget(self, name: str) -> None:
        """The model's application was deleted or redeployed: its replicas start from their arguments."""
        self._orders.pop(name, None)
        self._committed.pop(name, None)

    async def swap(
        self,
        model: ModelDescription,
        replicas: int,
        timeout_s: float,
        composing: dict[str, ModelDescription] | None = None,
    ) -> None:
        """Move every replica of ``model.name`` to ``model``; raise ``Unavailable`` with the reason
        (the old description still serving) when one cannot."""
        self._generation += 1
        gen, name = self._generation, model.name
        reports = self._reports.setdefault((name, gen), _Reports())
        deadline = time.monotonic() + timeout_s
        await self._post(Order(gen, PREPARE, model, composing))

        def prepared() -> bool:
            return len(reports.prepared) >= replicas or any(e is not None for e in reports.prepared.values())

        try:
            done = await self._until(prepared, deadline)
            errors = [e for e in reports.prepared.values() if e is not None]
            if errors or not done:
                reason = errors[0] if errors else f"the replicas did not load it within {timeout_s:.0f}s"
                await self._post(Order(gen, ABORT, model, composing))
                raise Unavailable(reason)
            order = Order(gen, COMMIT, model, composing)
            self._committed[name] = order
            await self._post(order)
            if not await self._until(lambda: len(reports.committed) >= replicas, deadline):
                logger.warning("model '%s': not every replica acknowledged the reload in time", name)
        finally:
            self._reports.pop((name, gen), None)

    async def describe(self, model: ModelDescription, replicas: int, timeout_s: float) -> None:
        """Hand every replica of ``model.name`` the description ``model`` (the same model with other
        instance counts) and wait, at most ``timeout_s``, for ``replicas`` of them to take it."""
        self._generation += 1
        gen, name = self._generation, model.name
        reports = self._reports.setdefault((name, gen), _Reports())
        try:
            await self._post(Order(gen, DESCRIBE, model, replicas=replicas))
            if not await self._until(
                lambda: len(reports.committed) >= replicas, time.monotonic() + timeout_s
            ):
                logger.warning("model '%s': not every replica took its new instance counts in time", name)
        finally:
            self._reports.pop((name, gen), None)


Prepare = Callable[[ModelDescription, "dict[str, ModelDescription] | None"], Awaitable[Any]]
Commit = Callable[[Any], Awaitable[None]]
Discard = Callable[[Any], Awaitable[None]]
Describe = Callable[[ModelDescription, int], Awaitable[None]]


async def follow(
    name: str,
    replica: str,
    server: ServerClient,
    prepare: Prepare,
    commit: Commit,
    discard: Discard,
    describe: Describe,
    poll_timeout_s: float = 20.0,
) -> None:
    """The replica side: wait for orders for ``name`` and carry them out, for the replica's life.

    ``server`` calls the server application; ``prepare`` builds and loads a runtime
    (raising with the reason), ``commit`` swaps to it, ``discard`` closes one not used, ``describe``
    takes a description that differs only in instance counts, with the model's number of replicas now."""
    seen: tuple[int, str] = (0, "")
    applied = 0  # the generation this replica serves (0: its deployment's arguments)
    prepared: tuple[int, Any] | None = None
    while True:
        try:
            order = await server.reload_order(name, seen, poll_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server is restarting or not up yet
            logger.debug("model '%s': waiting for reload orders: %s", name, exc)
            await asyncio.sleep(1.0)
            continue
        if order is None:
            continue
        if prepared is not None and (order.generation != prepared[0] or order.phase == ABORT):
            await discard(prepared[1])
            prepared = None
        if order.phase == PREPARE:
            error = None
            try:
                prepared = (order.generation, await prepare(order.model, order.composing))
            except Exception as exc:
                error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                logger.error("model '%s': the new description failed to load: %s", name, error)
            await server.reload_report(name, order.generation, replica, PREPARE, error)
        elif order.phase == COMMIT and order.generation > applied:
            runtime = None
            if prepared is not None and prepared[0] == order.generation:
                runtime = prepared[1]
            else:  # a replica that started after the order was given: catch up
                try:
                    runtime = await prepare(order.model, order.composing)
                except Exception:
                    logger.exception("model '%s': could not apply the committed reload", name)
            prepared = None
            if runtime is not None:
                await commit(runtime)
                applied = order.generation
            await server.reload_report(name, order.generation, replica, COMMIT, None)
        elif order.phase == DESCRIBE and order.generation > applied:
            await describe(order.model, order.replicas)
            applied = order.generation
            await server.reload_report(name, order.generation, replica, DESCRIBE, None)
        seen = order.key
