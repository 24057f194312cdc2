"""One key's requests take turns per web process (webapp/gate.py); other keys and keyless requests do not wait."""

from __future__ import annotations

import asyncio
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from webapp import gate

KEY_A = "Bearer tts_aaaaaaaa_" + "a" * 32
KEY_A_FORGED = "Bearer tts_aaaaaaaa_" + "b" * 32  # A's public prefix, another secret
KEY_B = "Bearer tts_bbbbbbbb_" + "b" * 32


class Held:
    """The rest of the stack, held open until the test lets a request finish."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.go = asyncio.Event()
        self.answering: dict[str, int] = {}
        self.most_answering: dict[str, int] = {}

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        who = request.headers.get("Authorization", "none")
        self.running[who] = self.running.get(who, 0) + 1
        self.most[who] = max(self.most.get(who, 0), self.running[who])
        try:
            if request.GET.get("wait"):
                gate.release(request)  # what the waiting views do before they wait
                await self.go.wait()
                async with gate.answer_turn(request):  # and after, to build the answer
                    self.answering[who] = self.answering.get(who, 0) + 1
                    self.most_answering[who] = max(self.most_answering.get(who, 0), self.answering[who])
                    await asyncio.sleep(0.01)
                    self.answering[who] -= 1
            await self.go.wait()
            return HttpResponse("ok")
        finally:
            self.running[who] -= 1


def _request(authorization: str | None = None, **params: str) -> HttpRequest:
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    return RequestFactory().get("/api/v1/speech", params, **headers)


def test_it_lets_one_key_run_two_requests_at_once_while_other_keys_pass() -> None:
    async def scenario() -> Held:
        held = Held()
        middleware = gate.ClientGateMiddleware(held)
        requests = [_request(KEY_A) for _ in range(5)]
        requests += [_request(KEY_B), _request(KEY_A_FORGED), _request(None), _request(None)]
        tasks = [asyncio.create_task(middleware(r)) for r in requests]
        await asyncio.sleep(0.05)
        assert held.running == {KEY_A: 2, KEY_B: 1, KEY_A_FORGED: 1, "none": 2}
        held.go.set()
        answers = await asyncio.gather(*tasks)
        assert [a.status_code for a in answers] == [200] * len(requests)
        assert gate._gates.get(asyncio.get_running_loop()) == {}  # nothing kept once idle
        return held

    held = asyncio.run(scenario())
    assert held.most[KEY_A] == 2


def test_a_waiting_request_holds_no_turn_and_takes_one_to_answer() -> None:
    async def scenario() -> None:
        held = Held()
        middleware = gate.ClientGateMiddleware(held)
        tasks = [asyncio.create_task(middleware(_request(KEY_A, wait="30"))) for _ in range(6)]
        await asyncio.sleep(0.05)
        assert held.running == {KEY_A: 6}  # each waits without holding a turn
        held.go.set()
        await asyncio.gather(*tasks)
        assert held.most_answering == {KEY_A: 2}  # the answers take turns again

    asyncio.run(scenario())


def test_a_failing_request_gives_its_turn_back() -> None:
    async def scenario() -> None:
        async def broken(request: HttpRequest) -> HttpResponse:
            raise RuntimeError("boom")

        middleware = gate.ClientGateMiddleware(broken)
        for _ in range(3):  # more than CLIENT_SLOTS: a leaked turn would block the third
            try:
                await asyncio.wait_for(middleware(_request(KEY_A)), 1)
            except RuntimeError:
                pass
        assert gate._gates.get(asyncio.get_running_loop()) == {}

    asyncio.run(scenario())
