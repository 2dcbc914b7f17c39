"""
The cluster's snapshot store (SPEC §15 with §13): the same Redis, so every gateway
process lists and restores any computer's snapshots.

Keys, all of one account under one prefix (``A`` = ``trapsandbox:snap:{"<account>"}:``, the
account as a JSON string; ``T`` = the traposId as a JSON string)::

    A seq:T            counter: the computer's last snapshot id (never reused)
    A list:T           sorted set: the computer's snapshot ids, scored by id
    A snap:T:<id>      the snapshot: JSON {created, reason, files: {path: [size, modified, sha256]}}
                       (``files``: ``model.manifest``'s bytes, as the quota counts them)
    A computers        set: the traposIds with a list
    A stored           sorted set: every content hash held, scored by when last touched (ms)
    A sizes            hash: content hash -> size
    A refs             hash: content hash -> how many snapshots use it (absent: none)
    A c:<sha256>       the content's bytes

Every change is one Lua script, so it is atomic: ``COMMIT`` checks every hash is held and
only then counts its references and lists the snapshot; ``DROP`` deletes a snapshot and
uncounts its references once (a second ``DROP`` finds nothing); ``SWEEP`` removes content
nobody references that was not touched since a time.  So a concurrent commit and prune
never leave a listed snapshot without its content.

Replies are bytes (``charset=None``: content is arbitrary bytes), so this store has its
own connection rather than the cluster's.  Every call is bounded (``call_timeout``);
while Redis is away a call fails at once with ``unavailable`` instead of queueing.
"""

from __future__ import annotations

from typing import Any

import orjson
import txredisapi
from twisted.internet.defer import CancelledError, Deferred, DeferredList, fail
from twisted.python.failure import Failure

from trapsandbox import limits
from trapsandbox.errors import GatewayError
from trapsandbox.snapshots import model, retention
from trapsandbox.snapshots.model import FileEntry, MissingContent, NotFound, Snapshot, Summary
from trapsandbox.snapshots.store import SnapshotStore, not_found

PREFIX = limits.CLUSTER_PREFIX + "snap:"

# KEYS: content, stored, sizes.  ARGV: data, now (ms), size, sha256.
PUT = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
redis.call('ZADD', KEYS[2], 'GT', ARGV[2], ARGV[4])
redis.call('HSET', KEYS[3], ARGV[4], ARGV[3])
return 1
"""

# KEYS: stored.  ARGV: now (ms), sha256...  -> the hashes not held (the others touched)
MISSING = """
local out = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'GT', ARGV[1], ARGV[i])
  else
    out[#out + 1] = ARGV[i]
  end
end
return out
"""

# KEYS: stored, refs, seq, list, computers.  ARGV: snapshot key prefix, traposId, record,
# distinct sha256...  -> {1, id}, or {0, {missing sha256...}} and nothing written
COMMIT = """
local missing = {}
for i = 4, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then missing[#missing + 1] = ARGV[i] end
end
if #missing > 0 then return {0, missing} end
for i = 4, #ARGV do redis.call('HINCRBY', KEYS[2], ARGV[i], 1) end
local seq = redis.call('INCR', KEYS[3])
redis.call('SET', ARGV[1] .. seq, ARGV[3])
redis.call('ZADD', KEYS[4], seq, seq)
redis.call('SADD', KEYS[5], ARGV[2])
return {1, seq}
"""

# KEYS: snapshot, list, refs.  ARGV: id, its distinct sha256...  -> 1 dropped, 0 already gone
DROP = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
for i = 2, #ARGV do
  if redis.call('HINCRBY', KEYS[3], ARGV[i], -1) <= 0 then redis.call('HDEL', KEYS[3], ARGV[i]) end
end
return 1
"""

# KEYS: stored, refs, sizes.  ARGV: before (ms), content key prefix.  -> {count, bytes}
SWEEP = """
local count, bytes = 0, 0
for _, sha in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  if not redis.call('HGET', KEYS[2], sha) then
    bytes = bytes + tonumber(redis.call('HGET', KEYS[3], sha) or '0')
    count = count + 1
    redis.call('DEL', ARGV[2] .. sha)
    redis.call('ZREM', KEYS[1], sha)
    redis.call('HDEL', KEYS[3], sha)
  end
end
return {count, bytes}
"""


class RedisStore(SnapshotStore):
    """On a txredisapi ``RedisFactory`` with ``charset=None``; ``connect`` makes one from a
    URL (``cluster.redis.command_connection``, as the cluster's own)."""

    def __init__(
        self,
        commands: txredisapi.RedisFactory,
        reactor: Any,
        call_timeout: float = limits.CLUSTER_CALL_TIMEOUT,
        **settings: Any,
    ) -> None:
        super().__init__(**settings)
        self._commands = commands
        self._reactor = reactor
        self._call_timeout = call_timeout

    @classmethod
    def connect(cls, url: str, reactor: Any, **settings: Any) -> RedisStore:
        """A store on its own lazy connection to ``url`` (it reconnects by itself)."""
        from trapsandbox.cluster.redis import RedisAddress, command_connection

        timeout = settings.get("call_timeout", limits.CLUSTER_CALL_TIMEOUT)
        commands = command_connection(RedisAddress.from_url(url), reactor, timeout, charset=None)
        return cls(commands, reactor, **settings)

    def wait_connected(self, timeout: float) -> Deferred[RedisStore]:
        """Fires once connected (for a start-up that wants to know; calls never wait)."""
        d: Deferred[RedisStore] = Deferred()

        def fired(result: object) -> object:
            if not d.called:
                d.callback(self)
            return result  # the factory's own waiters see what they would have

        self._commands.deferred.addBoth(fired)
        d.addTimeout(timeout, self._reactor)
        return d

    def close(self) -> Deferred[None]:
        d = self._commands.disconnect()
        d.addTimeout(self._call_timeout, self._reactor)
        d.addErrback(lambda _: None)
        return d

    # -- Redis calls: every one bounded ------------------------------------------------------

    @property
    def connected(self) -> bool:
        # txredisapi would queue a command until Redis is back: refuse at once instead.
        return self._commands.size > 0

    def _call(self, method: str, *args: Any) -> Deferred:
        if not self.connected:
            return fail(model.unavailable("not connected to Redis"))
        try:
            d = getattr(self._commands.handler, method)(*args)
        except Exception as error:
            return fail(model.unavailable(f"cannot call Redis: {error}"))
        d.addTimeout(self._call_timeout, self._reactor)
        d.addErrback(self._failed)
        return d

    def _failed(self, failure: Failure) -> Failure:
        if failure.check(GatewayError):
            return failure
        if failure.check(CancelledError, TimeoutError):
            message = f"Redis did not answer within {self._call_timeout:g} s"
        else:
            message = f"Redis failed: {failure.getErrorMessage()}"
        return Failure(model.unavailable(message))

    # -- Keys --------------------------------------------------------------------------------

    @staticmethod
    def _a(account: str) -> str:
        return f"{PREFIX}{{{_json(account)}}}:"

    def _snap_prefix(self, account: str, trapos_id: str) -> str:
        return f"{self._a(account)}snap:{_json(trapos_id)}:"

    def _list_key(self, account: str, trapos_id: str) -> str:
        return f"{self._a(account)}list:{_json(trapos_id)}"

    # -- The operations ----------------------------------------------------------------------

    def _latest(self, account: str, trapos_id: str) -> Deferred:
        d = self._call("zrevrange", self._list_key(account, trapos_id), 0, 0)

        def newest(ids: list[bytes]) -> Deferred | dict:
            if not ids:
                return {}
            d = self._call("get", self._snap_prefix(account, trapos_id) + ids[0].decode())
            # Pruned meanwhile: no snapshot to compare with, so everything is fetched.
            return d.addCallback(lambda record: _record(record)[2] if record else {})

        return d.addCallback(newest)

    def _missing(self, account: str, hashes: list[str], now: int) -> Deferred:
        if not hashes:
            return self._done(set())
        d = self._call("eval", MISSING, [self._a(account) + "stored"], [now, *hashes])
        return d.addCallback(lambda absent: {sha.decode() for sha in absent})

    def _put_content(self, account: str, sha256: str, data: bytes, now: int) -> Deferred:
        a = self._a(account)
        keys = [f"{a}c:{sha256}", a + "stored", a + "sizes"]
        return self._call("eval", PUT, keys, [data, now, len(data), sha256]).addCallback(
            lambda _: None
        )

    def _commit(
        self, account: str, trapos_id: str, files: dict[str, FileEntry], reason: str, now: int
    ) -> Deferred:
        a = self._a(account)
        computer = _json(trapos_id)
        # The file list as the quota counts it (``model.manifest``), byte for byte.
        record = b'{"created":%d,"reason":%b,"files":%b}' % (
            now,
            orjson.dumps(reason),
            model.manifest(files),
        )
        keys = [a + "stored", a + "refs", f"{a}seq:{computer}", f"{a}list:{computer}"]
        keys.append(a + "computers")
        hashes = sorted({e.sha256 for e in files.values()})
        args = [self._snap_prefix(account, trapos_id), trapos_id, record, *hashes]

        def committed(reply: list[Any]) -> str:
            if reply[0] != 1:
                raise MissingContent(sha.decode() for sha in reply[1])
            return str(int(reply[1]))

        return self._call("eval", COMMIT, keys, args).addCallback(committed)

    def _list(self, account: str, trapos_id: str) -> Deferred:
        d = self._call("zrevrange", self._list_key(account, trapos_id), 0, -1)

        def records(ids: list[bytes]) -> Deferred | list:
            if not ids:
                return []
            prefix = self._snap_prefix(account, trapos_id)
            d = self._call("mget", [prefix + i.decode() for i in ids])
            return d.addCallback(summaries, [i.decode() for i in ids])

        def summaries(values: list[bytes | None], ids: list[str]) -> list[Summary]:
            out = []
            for snapshot_id, value in zip(ids, values, strict=True):
                if value is not None:  # pruned between the two calls
                    created, reason, files = _record(value)
                    count, size = model.sized(files)
                    out.append(
                        Summary(snapshot_id, account, trapos_id, created, reason, count, size)
                    )
            return out

        return d.addCallback(records)

    def _get(self, account: str, trapos_id: str, seq: int, snapshot_id: str) -> Deferred:
        d = self._call("get", self._snap_prefix(account, trapos_id) + str(seq))

        def found(value: bytes | None) -> Snapshot:
            if value is None:
                raise not_found(snapshot_id)
            return Snapshot(str(seq), account, trapos_id, *_record(value))

        return d.addCallback(found)

    def _content(self, account: str, sha256: str) -> Deferred:
        d = self._call("get", f"{self._a(account)}c:{sha256}")

        def found(value: bytes | None) -> bytes:
            if value is None:
                raise NotFound(f"no content {sha256[:12]}... stored")
            return value

        return d.addCallback(found)

    def _held(self, account: str, trapos_id: str) -> Deferred:
        """The computer's snapshots as retention sees them."""
        d = self._list_ids(account, trapos_id)

        def records(ids: list[str]) -> Deferred | list:
            if not ids:
                return []
            prefix = self._snap_prefix(account, trapos_id)
            d = self._call("mget", [prefix + i for i in ids])
            return d.addCallback(held, ids)

        def held(values: list[bytes | None], ids: list[str]) -> list[retention.Held]:
            out = []
            for snapshot_id, value in zip(ids, values, strict=True):
                if value is not None:
                    created, _, files = _record(value)
                    listed = model.manifest(files)
                    out.append(retention.held(trapos_id, int(snapshot_id), created, files, listed))
            return out

        return d.addCallback(records)

    def _list_ids(self, account: str, trapos_id: str) -> Deferred:
        d = self._call("zrange", self._list_key(account, trapos_id), 0, -1)
        return d.addCallback(lambda ids: [i.decode() for i in ids])

    def _drop(self, account: str, held: retention.Held) -> Deferred:
        keys = [
            self._snap_prefix(account, held.trapos_id) + str(held.seq),
            self._list_key(account, held.trapos_id),
            self._a(account) + "refs",
        ]
        return self._call("eval", DROP, keys, [held.seq, *sorted(held.content)])

    def _prune(self, account: str, before: int) -> Deferred:
        a = self._a(account)
        d = self._call("smembers", a + "computers")

        def everything(computers: set[bytes] | list[bytes]) -> Deferred:
            ds = [self._held(account, t.decode()) for t in computers]
            return _all(ds).addCallback(lambda lists: [h for held in lists for h in held])

        def drop(held: list[retention.Held]) -> Deferred:
            dropped = retention.to_drop(held, self.keep, self.quota)
            d = _all([self._drop(account, h) for h in dropped])
            return d.addCallback(lambda _: dropped)

        def sweep(dropped: list[retention.Held]) -> Deferred:
            keys = [a + "stored", a + "refs", a + "sizes"]
            d = self._call("eval", SWEEP, keys, [before, a + "c:"])
            return d.addCallback(
                lambda reply: model.Pruned(
                    tuple((h.trapos_id, str(h.seq)) for h in dropped),
                    int(reply[0]),
                    int(reply[1]),
                )
            )

        return d.addCallback(everything).addCallback(drop).addCallback(sweep)

    def _delete_computer(self, account: str, trapos_id: str) -> Deferred:
        d = self._held(account, trapos_id)

        def drop(held: list[retention.Held]) -> Deferred:
            return _all([self._drop(account, h) for h in held]).addCallback(sum)

        return d.addCallback(drop)

    def _done(self, value: Any) -> Deferred:
        d: Deferred = Deferred()
        d.callback(value)
        return d


def _json(value: str) -> str:
    return orjson.dumps(value).decode()


def _record(value: bytes) -> tuple[int, str, dict[str, FileEntry]]:
    record = orjson.loads(value)
    return record["created"], record["reason"], model.from_manifest(record["files"])


def _all(ds: list[Deferred]) -> Deferred:
    """Every result in order, or the first failure."""
    d = DeferredList(ds, fireOnOneErrback=True, consumeErrors=True)
    d.addCallbacks(
        lambda results: [value for _, value in results],
        lambda failure: failure.value.subFailure,
    )
    return d
