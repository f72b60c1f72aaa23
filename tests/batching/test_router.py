"""The router alone decides where an inference runs: here, at a sequence's owner, or at another
model's replicas; an HTTP request sent on to an owner travels unchanged (no Ray running)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.forward_order import SEQUENCE_ORDER, ArrivalGate, Order, PlacingLine, SendOrder
from deployments.runtime.router import (
    FORWARDED,
    Placement,
    Ranks,
    RawReply,
    RawRequest,
    Router,
    Where,
    owner_rank,
)
from repository_loader.errors import NotFound, Unavailable, Unsupported


class Runner:
    """A model run here: answers with its own name, and streams two responses."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[InferRequest] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request)
        return InferResponse(outputs={"OUT": request.inputs["IN"]}, model_name=self.name, id="here")

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        self.calls.append(request)
        yield InferResponse(final=False, id="here-1")
        yield InferResponse(final=True, id="here-2")


class Elsewhere:
    """Another model's replicas (the serving layer's executor), streaming where ``streams``."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request.model_name)
        return InferResponse(model_name=request.model_name, id="elsewhere")


class StreamingElsewhere(Elsewhere):
    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        self.calls.append(request.model_name)
        for i in range(3):
            yield InferResponse(final=i == 2, id=f"elsewhere-{i}")


class Owners:
    """The replicas holding other ranks: a raw request comes back as a raw reply."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, RawRequest | None]] = []

    async def forward(
        self, model: str, rank: int, request: InferRequest, raw: RawRequest | None, order: Order
    ) -> InferResponse | RawReply:
        self.sent.append((rank, raw))
        if raw is not None:
            return 200, [(b"content-type", b"application/json")], b'{"from": %d}' % rank
        return InferResponse(model_name=model, id=f"owner-{rank}")


def _request(model: str = "m", cid: int | str = 0) -> InferRequest:
    return InferRequest(model, {"IN": np.zeros((1, 1), np.int32)}, correlation_id=cid)


def _sequences(rank: int, world: int) -> tuple[int, int]:
    """A correlation ID this rank owns and one another rank owns."""
    mine = next(c for c in range(1, 200) if owner_rank(c, world) == rank)
    other = next(c for c in range(1, 200) if owner_rank(c, world) != rank)
    return mine, other


async def test_a_model_served_here_runs_here_and_any_other_goes_to_the_executor() -> None:
    here, elsewhere = Runner("m"), Elsewhere()
    router = Router({"m": here}, remote=elsewhere)
    assert router.place(_request("m")) == Placement(Where.LOCAL)
    assert router.place(_request("n")) == Placement(Where.REMOTE)
    assert (await router.infer(_request("m"))).id == "here"
    assert (await router.infer(_request("n"))).id == "elsewhere"
    assert len(here.calls) == 1 and elsewhere.calls == ["n"]


async def test_a_passive_instance_sends_its_models_requests_on_and_runs_none() -> None:
    here, elsewhere = Runner("m"), Elsewhere()
    router = Router({"m": here}, remote=elsewhere, passive={"m": True})  # another group takes requests
    assert router.place(_request("m")) == Placement(Where.REMOTE)
    assert (await router.infer(_request("m"))).id == "elsewhere"
    assert here.calls == [] and elsewhere.calls == ["m"]


async def test_where_every_group_is_passive_a_request_is_refused_unavailable() -> None:
    here, elsewhere = Runner("m"), StreamingElsewhere()
    router = Router({"m": here}, remote=elsewhere, passive={"m": False})
    with pytest.raises(Unavailable, match="every instance group of the model is passive"):
        await router.infer(_request("m"))
    with pytest.raises(Unavailable):
        router.stream(_request("m"))
    assert (await router.infer(_request("n"))).id == "elsewhere"  # other models go on as before
    assert here.calls == [] and elsewhere.calls == ["n"]


async def test_without_an_executor_another_model_is_unknown() -> None:
    router = Router({"m": Runner("m")})
    with pytest.raises(NotFound, match="Request for unknown model: 'n' is not found"):
        await router.infer(_request("n"))
    with pytest.raises(NotFound):
        router.stream(_request("n"))


async def test_a_sequence_runs_at_its_owner_and_a_raw_request_travels_unchanged() -> None:
    here, owners = Runner("m"), Owners()
    router = Router({"m": here}, ranks=Ranks("m", 0, 3), owners=owners)
    mine, other = _sequences(0, 3)
    assert router.place(_request("m", mine)) == Placement(Where.LOCAL)
    assert router.place(_request("m", other)) == Placement(Where.OWNER, owner_rank(other, 3))
    assert router.place(_request("m")).where is Where.LOCAL  # not a sequence
    raw = RawRequest("/v2/models/m/infer", [(b"content-type", b"application/json")], b"{}")
    reply = await router.route(_request("m", other), raw)
    assert reply == (200, [(b"content-type", b"application/json")], b'{"from": %d}' % owner_rank(other, 3))
    assert owners.sent == [(owner_rank(other, 3), raw)]
    response = await router.infer(_request("m", other))  # a gRPC or BLS call: no raw body
    assert isinstance(response, InferResponse) and response.id == f"owner-{owner_rank(other, 3)}"
    assert (await router.infer(_request("m", mine))).id == "here"
    assert (router.answered_here, router.sent_to_owner) == (1, 2)


async def test_a_request_sent_on_to_its_owner_runs_where_it_lands() -> None:
    here, owners = Runner("m"), Owners()
    router = Router({"m": here}, ranks=Ranks("m", 1, 2), owners=owners)
    _, other = _sequences(1, 2)
    forwarded = RawRequest("/v2/models/m/infer", [(FORWARDED, b"1")], b"{}")
    assert forwarded.forwarded and router.place(_request("m", other), forwarded).where is Where.LOCAL
    answer = await router.route(_request("m", other), forwarded)
    assert isinstance(answer, InferResponse) and answer.id == "here" and owners.sent == []


class HeldRunner(Runner):
    """A stateful model held as Triton's delayed qa tests hold it: no request is answered until
    ``hold`` are queued. Records the order requests are queued in (the synchronous start of ``infer``)."""

    def __init__(self, name: str, hold: int) -> None:
        super().__init__(name)
        self.queued: list[tuple[int | str, int]] = []
        self.released = asyncio.Event()
        self.hold = hold

    async def infer(self, request: InferRequest) -> InferResponse:
        self.queued.append((request.correlation_id, _step(request)))
        if len(self.queued) >= self.hold:
            self.released.set()
        await self.released.wait()
        return InferResponse(model_name=self.name, id=f"{request.correlation_id}-{_step(request)}")


def _step(request: InferRequest) -> int:
    return int(np.asarray(request.inputs["IN"]).reshape(-1)[0])


class SlowWire:
    """Owners reached over a wire on which each request's STEP input sets its time on the way: a
    sequence's first request is the slowest to arrive. Hands each to the owner's router as the
    serving layer does (a raw request with the forwarding headers)."""

    def __init__(self, owner: Router) -> None:
        self.owner = owner
        self.on_the_way = self.most_on_the_way = 0

    async def forward(
        self, model: str, rank: int, request: InferRequest, raw: RawRequest | None, order: Order
    ) -> InferResponse | RawReply:
        self.on_the_way += 1
        self.most_on_the_way = max(self.most_on_the_way, self.on_the_way)
        await asyncio.sleep(0.2 if _step(request) == 0 else 0.01 * (3 - _step(request)))
        self.on_the_way -= 1
        headers = [(FORWARDED, str(rank).encode()), (SEQUENCE_ORDER, order.header().encode())]
        return await self.owner.route(request, RawRequest("/v2/models/m/infer", headers, b""))


async def test_a_sequences_requests_are_queued_at_their_owner_in_the_order_they_came() -> None:
    held = HeldRunner("m", hold=6)
    owner = Router({"m": held}, ranks=Ranks("m", 1, 2))
    router = Router({"m": Runner("m")}, ranks=Ranks("m", 0, 2), owners=SlowWire(owner))
    wire = router.owners
    assert isinstance(wire, SlowWire)
    others = [c for c in range(1, 200) if owner_rank(c, 2) == 1][:2]

    def step(cid: int, n: int) -> InferRequest:
        return InferRequest("m", {"IN": np.full((1, 1), n, np.int32)}, correlation_id=cid)

    # sent as a stream sends them: every request at once, in order; the owner answers none of them
    # until all six are queued there (Triton's TRITONSERVER_DELAY_SCHEDULER), so none may wait for
    # an earlier one's answer on the way
    answers = await asyncio.wait_for(
        asyncio.gather(*(router.infer(step(cid, n)) for n in range(3) for cid in others)), 5
    )
    assert [a.id for a in answers] == [f"{cid}-{n}" for n in range(3) for cid in others]
    for cid in others:
        assert [n for c, n in held.queued if c == cid] == [0, 1, 2]
    assert wire.most_on_the_way == 6
    assert router.sending.waiting == 0 and owner.arrivals.gaps == 0
    assert owner.arrivals.remembered == 2  # one entry per (sender, sequence)


async def test_a_request_whose_predecessor_never_arrives_is_queued_after_the_gap() -> None:
    here = Runner("m")
    owner = Router({"m": here}, ranks=Ranks("m", 1, 2))
    owner.arrivals = ArrivalGate(gap_s=0.1)
    _, other = _sequences(1, 2)
    headers = [(FORWARDED, b"1"), (SEQUENCE_ORDER, b"sender 8 7")]  # request 7 was lost on the way
    started = asyncio.get_running_loop().time()
    answer = await owner.route(_request("m", other), RawRequest("/v2/models/m/infer", headers, b""))
    assert isinstance(answer, InferResponse) and answer.id == "here"
    assert asyncio.get_running_loop().time() - started >= 0.1 and owner.arrivals.gaps == 1
    # once 8 passed, a late 7 and anything after 8 pass at once: not after a gap, now longer than the
    # test waits
    owner.arrivals.gap_s = 60.0
    for value in (b"sender 7", b"sender 9 8"):
        headers = [(FORWARDED, b"1"), (SEQUENCE_ORDER, value)]
        await asyncio.wait_for(owner.route(_request("m", other), RawRequest("/p", headers, b"")), 10)
    assert owner.arrivals.gaps == 1 and len(here.calls) == 3


def test_an_order_header_reads_back_and_anything_else_is_no_order() -> None:
    sending = SendOrder()
    first, second = sending.next(5), sending.next(5)
    assert (first.after, second.after) == (None, first.n)
    assert Order.parse(second.header().encode()) == second and Order.parse(first.header()) == first
    sending.answered(5, first)  # not the latest: the next still comes after the second
    assert sending.next(5).after == second.n
    assert sending.next("5").after is None  # another sequence
    for junk in (b"", b"x", b"x y", b"a 1 2 3", b"a 1 b"):
        assert Order.parse(junk) is None


async def test_the_owner_forgets_idle_senders() -> None:
    gate = ArrivalGate(keep_s=0.0)
    await gate.turn(1, Order("a", 1))
    await gate.turn(2, Order("a", 2))
    assert gate.remembered == 1  # only the latest, every older one idle for keep_s


async def test_requests_held_behind_a_start_go_on_in_the_order_they_came_and_nothing_overtakes_them() -> None:
    """Each request let on reaches its queue before the next is woken; one that comes after the START
    went on, while others still wait, queues behind them instead of going straight on."""
    line = PlacingLine()
    went: list[str] = []

    async def request(name: str) -> None:
        await line.wait(7)
        went.append(name)  # what reaches its queue, synchronously after its turn

    assert not line.holding(7)
    await request("alone")  # nothing held: on at once
    line.hold(7)
    first = [asyncio.ensure_future(request(f"waited-{n}")) for n in range(3)]
    await asyncio.sleep(0)
    assert went == ["alone"] and line.holding(7)
    line.release(7)  # the START went on; the first waiter is woken on a later turn of the loop
    late = asyncio.ensure_future(request("came-after-the-start"))
    other = asyncio.ensure_future(_wait_then(line, 8, went))  # another sequence never waits
    await asyncio.gather(*first, late, other)
    assert [w for w in went if w != "other"] == [
        "alone", "waited-0", "waited-1", "waited-2", "came-after-the-start"
    ]  # fmt: skip
    assert "other" in went
    assert line.lines == 0


async def _wait_then(line: PlacingLine, cid: int, went: list[str]) -> None:
    await line.wait(cid)
    went.append("other")


async def test_a_start_let_on_from_the_line_holds_those_behind_it_and_a_waiter_that_leaves_passes_on() -> (
    None
):
    line = PlacingLine()
    went: list[str] = []
    line.hold(7)

    async def request(name: str, start: bool = False) -> None:
        await line.wait(7)
        went.append(name)
        if start:  # asks for a slot in its turn: those behind it wait again until it went on
            line.hold(7)
            await asyncio.sleep(0.02)
            went.append(name + " placed")
            line.release(7)

    tasks = [
        asyncio.ensure_future(request("step")),
        asyncio.ensure_future(request("restart", start=True)),
        asyncio.ensure_future(request("leaves")),
        asyncio.ensure_future(request("after")),
    ]
    await asyncio.sleep(0)
    tasks[2].cancel()  # its client left while it waited
    line.release(7)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert went == ["step", "restart", "restart placed", "after"]
    assert line.lines == 0


async def test_a_sequence_whose_owner_cannot_be_reached_never_runs_here() -> None:
    router = Router({"m": Runner("m")}, ranks=Ranks("m", 0, 2))
    _, other = _sequences(0, 2)
    with pytest.raises(Unavailable, match=f"sequence {other} to model 'm'.*rank {owner_rank(other, 2)}"):
        await router.infer(_request("m", other))
    with pytest.raises(Unavailable, match="cannot be reached"):
        router.stream(_request("m", other))  # a stream cannot be sent on to one replica


async def test_streams_run_where_inference_runs() -> None:
    here = Runner("m")
    router = Router({"m": here}, remote=StreamingElsewhere())
    assert [r.id async for r in router.stream(_request("m"))] == ["here-1", "here-2"]
    assert [r.id async for r in router.stream(_request("n"))] == [f"elsewhere-{i}" for i in range(3)]
    plain = Router({}, remote=Elsewhere())  # an executor that cannot stream: its one response
    assert [r.id async for r in plain.stream(_request("n"))] == ["elsewhere"]


async def test_an_ensemble_router_runs_its_hosted_models_here_and_the_rest_through_the_replica() -> None:
    hosted: dict[str, Any] = {}
    replica = Router({"ens": Runner("ens")}, remote=Elsewhere())
    steps = Router(hosted, remote=replica)
    assert steps.place(_request("a")).where is Where.REMOTE
    hosted["a"] = Runner("a")  # loaded after the router was made: the mapping is kept
    assert (await steps.infer(_request("a"))).id == "here"
    assert (await steps.infer(_request("b"))).id == "elsewhere"
    assert (await steps.infer(_request("ens"))).id == "here"  # the replica's own model, through it


def test_a_replacement_runner_serves_from_then_on() -> None:
    old, new = Runner("m"), Runner("m")
    router = Router({"m": old})
    router.serve("m", new)
    assert router.local["m"] is new


def test_owner_rank_tells_int_and_string_ids_apart_and_spreads_them() -> None:
    assert owner_rank(5, 7) == owner_rank(5, 7)
    assert {owner_rank(c, 4) for c in range(1, 100)} == {0, 1, 2, 3}
    assert any(owner_rank(c, 97) != owner_rank(str(c), 97) for c in range(1, 20))


class Control(Elsewhere):
    """An executor that also carries BLS model control to the server."""

    def __init__(self) -> None:
        super().__init__()
        self.control: list[tuple[Any, ...]] = []

    async def load_model(self, name: str, config: str, files: Any) -> None:
        self.control.append(("load", name, config, dict(files)))

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        self.control.append(("unload", name, unload_dependents))

    async def is_model_ready(self, name: str, version: str) -> bool:
        self.control.append(("ready", name, version))
        return True


async def test_bls_model_control_goes_through_the_remote_executor_or_is_refused() -> None:
    control = Control()
    router = Router({"m": Runner("m")}, remote=control)
    await router.load_model("t", "{}", {"file:1/model.py": b""})
    await router.unload_model("t", True)
    assert await router.is_model_ready("t", "")
    assert control.control == [
        ("load", "t", "{}", {"file:1/model.py": b""}),
        ("unload", "t", True),
        ("ready", "t", ""),
    ]
    with pytest.raises(Unsupported, match="load_model is not supported"):
        await Router({"m": Runner("m")}, remote=Elsewhere()).load_model("t", "", {})
