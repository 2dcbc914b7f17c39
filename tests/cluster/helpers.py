"""Gateways in cluster mode as real ``twistd`` processes sharing one test Redis."""

from __future__ import annotations

import time
from urllib.parse import quote

import orjson
import treq
from twisted.internet import task
from twisted.web.client import HTTPConnectionPool

from tests.harness.processes import Child, spawn_gateway
from tests.harness.support import TestComputer, bounded, connect, reactor

# Short enough for tests: owner keys live 1.5 s, heartbeats every 0.5 s.
REFRESH_MS = "500"


class Gateway:
    def __init__(self, child: Child, port: int, instance: str) -> None:
        self.child = child
        self.port = port
        self.instance = instance
        self.url = f"http://127.0.0.1:{port}"


async def start_gateway(testcase, redis_url: str, **env: str) -> Gateway:
    settings = {
        "OPENCODE_URL": "",
        "SANDBOX_REDIS_URL": redis_url,
        "SANDBOX_REDIS_REFRESH_MS": REFRESH_MS,
        **env,
    }
    child = spawn_gateway(testcase, **settings)  # clean_env: this tree's code on PYTHONPATH
    port = await child.listening_port()
    instance = (await child.wait_for(r"cluster mode: gateway (\w+)")).group(1)
    await child.wait_for(r"cluster: listening on")
    return Gateway(child, port, instance)


class Http:
    """Plain HTTP to the gateways, no pooled connection left behind."""

    def __init__(self) -> None:
        self.pool = HTTPConnectionPool(reactor(), persistent=False)

    async def get(self, gateway: Gateway, path: str, seconds: float = 10, token: str | None = None):
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        response = await bounded(
            treq.get(gateway.url + path, headers=headers, pool=self.pool), seconds
        )
        body = await bounded(treq.content(response), seconds)
        return response.code, orjson.loads(body)

    async def get_text(self, gateway: Gateway, path: str, seconds: float = 10):
        response = await bounded(treq.get(gateway.url + path, pool=self.pool), seconds)
        return response.code, (await bounded(treq.content(response), seconds)).decode()

    async def request(
        self, gateway: Gateway, trapos_id: str, body: dict, seconds: float = 10, path="requests"
    ):
        url = f"{gateway.url}/computers/{quote(trapos_id, safe='')}/{path}"
        response = await bounded(treq.post(url, json=body, pool=self.pool), seconds)
        content = await bounded(treq.content(response), seconds)
        return response.code, content

    async def mcp(self, gateway: Gateway, method: str, params: dict, seconds: float = 10):
        """One JSON-RPC request to ``/mcp``; its result."""
        message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        response = await bounded(
            treq.post(gateway.url + "/mcp", json=message, pool=self.pool), seconds
        )
        return orjson.loads(await bounded(treq.content(response), seconds))["result"]


async def until(condition, seconds: float = 10, step: float = 0.05):
    """Poll ``condition`` (maybe async) until it is true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {seconds} s")
        await task.deferLater(reactor(), step, lambda: None)


class Pinged(TestComputer):
    """A test computer that answers every ``ping`` by itself."""

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        frame = orjson.loads(payload)
        if frame.get("event") == "gateway_request" and frame.get("type") == "ping":
            self.respond(frame, payload={"traposId": self.trapos_id})
        else:
            self.messages.put(frame)


async def computer(testcase, gateway: Gateway, trapos_id: str, answers_pings: bool = True):
    """A computer connected to ``gateway`` that completed hello."""
    connected = await connect(testcase, gateway.port, protocol=Pinged if answers_pings else None)
    reply = await connected.hello(trapos_id=trapos_id)
    testcase.assertTrue(reply["ok"], reply)
    return connected


async def ping(http: Http, gateway: Gateway, trapos_id: str, seconds: float = 10):
    code, body = await http.request(gateway, trapos_id, {"type": "ping"}, seconds)
    return code, orjson.loads(body)
