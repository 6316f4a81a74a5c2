"""The SQS endpoint's actors: HTTP replicas and the state they share.

Each :class:`SqsEndpoint` replica is a named actor running an aiohttp server on
its node; replicas on one node share the port with SO_REUSEPORT, so the kernel
spreads connections over them. A replica verifies each request's SigV4
signature against the account keys it copies from the manager, then runs the
operation (:class:`rayq.sqs.api.SqsApi`) on a thread pool through a rayq Client
that signs for the caller's account, so the runtime's gates check every
request as they check any client's. A request's Authorization header (or a
presigned one's X-Amz-* query parameters: account, scope, time) is checked before its
body is read, and nothing shared is spent before its signature is: a request that signs
its body's hash (X-Amz-Content-SHA256) is verified first, then read against a budget
shared by all connections; any other is read holding one of its peer address's few
unverified slots, then verified. Each verified account gets a bounded share of threads
and requests (:mod:`rayq.sqs.admission`), large bodies are hashed and parsed on worker
threads, and a long poll waits on the event loop, not on a thread. :class:`SqsState`
persists the queue settings rayq's registry does not keep and forwards changed receipt
handles.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import threading
import logging
import uuid
from collections import Counter
from dataclasses import replace
from functools import partial
from concurrent.futures import ThreadPoolExecutor

import ray
import ray.experimental.internal_kv as internal_kv
from aiohttp import web

from actors.base import (COPIES_INTERVAL_S, LIVENESS, LIVENESS_GROUPS, keep_copies, open_kv,
                        replicated_store)
from rayq.sqs.movers import Movers
from rayq.channel import host_id
from rayq.client import Client
from rayq.config import Config
from rayq.core.auth.accounts import Signer
from rayq.core.control.control_places import SQS_STORE
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.renewed import MISSING, Refreshed, Renewed
from rayq.core.codec.model import pack, unpack
from rayq.errors import RayqError
from rayq.handoff import Doors, Served
from rayq.names import SQS_STATE, namespace
from rayq.remote import NO_RETRY, call, call_async, named
from rayq.sqs.admission import (BodyBudget, EndpointStats, Forwards, Shares, Unverified,
                                 announced_size, off_loop)
from rayq.sqs.api import MESSAGE_ACTIONS, SqsApi
from rayq.sqs.attributes import Settings
from rayq.sqs import protocol
from rayq.sqs.errors import SqsError
from rayq.sqs.fifo import Admitted, Dedup
from rayq.sqs.moves import MoveTask
from rayq.sqs.names import HOME_REGION, access_key_id
from rayq.sqs.protocol import JSON_TYPE, XML_TYPE, decode_request
from rayq.sqs.sigv4 import (EMPTY_SHA256, MAX_SKEW_S, Caller, Claim, SignedRequest, check_payload,
                            claim, signed_payload_hash, verify, verify_claim)

log = logging.getLogger("rayq.sqs")
STATE = SQS_STATE
KEYS_MAX_AGE_S = 2.0      # a replaced key is refused here at most this long after rotation
KEYS_MIN_REFRESH_S = 1.0  # unknown keys refetch at most this often (forgeries cannot flood)
SETTINGS_TTL_S = 2.0      # another replica's SetQueueAttributes shows here within this
SWEEP_EVERY = 1000        # FIFO sends between two sweeps of a queue's old deduplication ids
WORKER_THREADS = 64       # a thread is held for one rayq call, never for a parked long poll
THREADS_PER_ACCOUNT = WORKER_THREADS // 4
IN_FLIGHT_PER_ACCOUNT = 256  # admitted requests of one account, parked long polls included
# A batch carries up to 1 MiB of bodies; JSON escapes (\uXXXX for non-ASCII) can triple it.
MAX_REQUEST_BYTES = 8 << 20
MAX_BUFFERED_BYTES = 8 * MAX_REQUEST_BYTES  # verified bodies being read at once, all connections
# Requests of one peer address read before their signature can be checked (the body's
# hash is not signed in a header, as botocore's SQS client signs): a peer's share, not the
# replica's, so a forger holds only its own; 16 x 8 MiB bounds what one address buffers.
UNVERIFIED_PER_PEER = 16
BODY_TIMEOUT_S = 10.0     # a body must arrive within this of its headers
MAX_CONNECTIONS = 1024    # open connections per replica; more are closed at once
KEEPALIVE_S = 15.0        # an idle keep-alive connection is closed after this


SQS_REGION_KEY = b"rayq/sqs/home-region"  # in Ray's GCS: the SQS endpoint's home region


def sqs_home_region() -> str | None:
    """The home region the SQS endpoint serves (None: never served in this cluster)."""
    raw = internal_kv._internal_kv_get(SQS_REGION_KEY, namespace=namespace())
    return raw.decode() if raw else None


def set_sqs_home_region(region: str) -> None:
    internal_kv._internal_kv_put(SQS_REGION_KEY, region.encode(), overwrite=True,
                                 namespace=namespace())


def launch_state(home: str, config: Config) -> tuple:
    """The SQS state actor as the control plane starts it on a data node's copy in
    ``home`` (registered by ``serve_sqs``): its Ray class, arguments and options (one call
    at a time, as the SQS state has always been served)."""
    return SqsStateRemote, (home, config, sqs_home_region() or HOME_REGION, None), \
        {"max_concurrency": 1}

def replica_name(index: int | str) -> str:
    return f"rayq-sqs-{index}"


class SqsState:
    """Queue settings, persisted (LMDB, fsync'd), and receipt forwards, in memory: after a
    ChangeMessageVisibility rayq's receipt changes while the client keeps its handle.
    Forwards are lost when this actor restarts; the handle then needs a new receive.
    Each queue owner keeps its own bounded share (:class:`Forwards`), so one account's changes
    never push out another's. Message move tasks are kept and run here too (:class:`Movers`;
    without a ``config`` none can start). It takes the kit's store helpers and liveness
    group (:mod:`actors.base`) but not :class:`~actors.base.RuntimeActor`: a threaded
    actor serving one call at a time, which an async method of the kit's would make Ray
    run as an async actor; its copies are kept on a thread."""

    def __init__(self, data_dir: str, config: Config | None = None,
                 home_region: str = HOME_REGION, clock: Clock | None = None,
                 start_copy=None):
        # on a cluster, kept on copies on other data nodes as the control stores are
        self.kv = replicated_store(SQS_STORE, open_kv(data_dir, SQS_STORE, map_size=256 << 20),
                                   config, start_copy)
        self._stopping = threading.Event()
        if self.kv.place is not None:
            threading.Thread(target=self._keep_copies, args=(config,), daemon=True).start()
        self.dedup = Dedup(self.kv)
        self._records: Counter[str] = Counter()  # FIFO records per queue since its last sweep
        self._forwards = Forwards()
        self._movers = Movers(self.kv, config, home_region, clock or SystemClock()) \
            if config is not None else None

    def settings(self, account: str, queue: str) -> dict | None:
        raw = self.kv.read(lambda txn: txn.get("meta", _key(account, queue)))
        return unpack(raw) if raw is not None else None

    def save(self, account: str, queue: str, record: dict | None) -> None:
        key = _key(account, queue)
        if record is None:  # the queue is deleted: its deduplication ids go with it
            self.kv.transact(lambda txn: txn.delete("meta", key))
            self.dedup.forget(key.decode(), math.inf)
            self._records.pop(key.decode(), None)
        else:
            self.kv.transact(lambda txn: txn.put("meta", key, pack(record)))

    def fifo_admit(self, account: str, queue: str, keys: list[str], now: float) -> list[Admitted]:
        return self.dedup.admit(_key(account, queue).decode(), keys, now)

    def fifo_record(self, account: str, queue: str, sent: list, now: float) -> None:
        name = _key(account, queue).decode()
        self.dedup.record(name, [tuple(s) for s in sent], now)
        self._records[name] += 1
        if self._records[name] >= SWEEP_EVERY:  # its ids past the window go now and then
            del self._records[name]
            self.dedup.forget(name, now)

    def fifo_release(self, account: str, queue: str, keys: list[str]) -> None:
        self.dedup.release(_key(account, queue).decode(), keys)

    def forward(self, owner: str, handle: str) -> str | None:
        return self._forwards.get(owner, handle)

    def record(self, owner: str, handle: str, receipt: str) -> None:
        self._forwards.put(owner, handle, receipt)

    def move_start(self, task: MoveTask) -> bool:
        return self._movers is not None and self._movers.start(task)

    def move_list(self, source_arn: str) -> list[MoveTask]:
        return self._movers.tasks.listed(source_arn) if self._movers is not None else []

    def move_cancel(self, handle: str) -> MoveTask | None:
        return self._movers.cancel(handle) if self._movers is not None else None

    @ray.method(concurrency_group=LIVENESS)
    def ping(self) -> int:
        return 1

    def _keep_copies(self, config: Config) -> None:
        """Keep the store's copies every COPIES_INTERVAL_S (a sync actor: a thread)."""
        while not self._stopping.wait(COPIES_INTERVAL_S):
            try:
                keep_copies(self.kv, config)
            except Exception as err:  # noqa: BLE001 - the next round tries again
                log.warning("SQS state: keeping its copies failed: %r", err)


def _key(account: str, queue: str) -> bytes:
    return b"sqs:" + account.encode() + b"\x00" + queue.encode()


class ReplicaState:
    """A replica's view of :class:`SqsState`: settings cached for SETTINGS_TTL_S, forwards
    it recorded itself known without a call. Called from the worker threads."""

    def __init__(self, state, clock: Clock):
        self._state, self.clock = state, clock
        self._settings = Renewed(SETTINGS_TTL_S)
        self._renewals = ThreadPoolExecutor(1, thread_name_prefix="sqs-settings")
        self._forwards = Forwards()
        self._latest = Forwards()   # message id -> the receipt this replica last gave it

    def settings(self, account: str, queue: str) -> Settings:
        """A queue's settings as read at most SETTINGS_TTL_S ago, renewed in the background
        while the queue is in use (:class:`~rayq.core.kit.renewed.Renewed`)."""
        name, now = (account, queue), self.clock.monotonic()
        settings, renew = self._settings.get(name, now)
        if renew:
            self._renewals.submit(self._renew, name, now)
        if settings is MISSING:
            settings = self._settings.keep(name, now, Settings.from_record(
                call(lambda: self._state.settings.remote(account, queue))))
        return settings

    def _renew(self, name: tuple[str, str], read_at: float) -> None:
        """Read a queue's settings again, on the renewal thread (failures are let be: the
        first read past the TTL asks itself)."""
        try:
            record = call(lambda: self._state.settings.remote(*name), NO_RETRY)
            self._settings.keep(name, read_at, Settings.from_record(record))
        except RayqError:
            pass
        finally:
            self._settings.renewed(name)

    def save(self, account: str, queue: str, settings: Settings | None) -> None:
        record = settings.to_record() if settings is not None else None
        call(lambda: self._state.save.remote(account, queue, record))
        self._settings.changed((account, queue), self.clock.monotonic())

    def forward(self, owner: str, handle: str) -> str | None:
        return (self._forwards.get(owner, handle)
                or call(lambda: self._state.forward.remote(owner, handle)))

    def record(self, owner: str, handle: str, receipt: str) -> None:
        call(lambda: self._state.record.remote(owner, handle, receipt))
        self._forwards.put(owner, handle, receipt)

    def fifo_admit(self, account: str, queue: str, keys: list[str], now: float) -> list[Admitted]:
        return call(lambda: self._state.fifo_admit.remote(account, queue, keys, now))

    def move_start(self, task: MoveTask) -> bool:
        return call(lambda: self._state.move_start.remote(task))

    def move_list(self, source_arn: str) -> list[MoveTask]:
        return call(lambda: self._state.move_list.remote(source_arn))

    def move_cancel(self, handle: str) -> MoveTask | None:
        return call(lambda: self._state.move_cancel.remote(handle))

    def fifo_record(self, account: str, queue: str, sent: list, now: float) -> None:
        call(lambda: self._state.fifo_record.remote(account, queue, sent, now))

    def fifo_release(self, account: str, queue: str, keys: list[str]) -> None:
        call(lambda: self._state.fifo_release.remote(account, queue, keys))

    def latest(self, owner: str, message_id: str, receipt: str | None = None) -> str | None:
        """The receipt this replica last gave the message (recording ``receipt`` first)."""
        if receipt is not None:
            self._latest.put(owner, message_id, receipt)
        return self._latest.get(owner, message_id)


class AccountSigner(Signer):
    """Signs for one account with whichever of its keys the last caller proved: after a
    rotation, requests signed with the new key move this signer (and every send path
    bound to it) over to the new key."""

    def rekey(self, key: str) -> None:
        if key != self._secret:
            self._secret = key


class Keys:
    """A copy of every account's keys from the manager, refreshed when older than
    KEYS_MAX_AGE_S, or (at most every KEYS_MIN_REFRESH_S) when a request names an account
    or key the copy lacks (:class:`~rayq.core.kit.renewed.Refreshed`)."""

    def __init__(self, manager, clock: Clock):
        self._manager, self.clock = manager, clock
        self.table: dict[str, list[str]] = {}
        self._by_id: dict[str, tuple[str, str]] = {}   # access key id -> (account, key)
        self._copy = Refreshed(self._fetch, None, clock, max_age_s=KEYS_MAX_AGE_S,
                               min_gap_s=KEYS_MIN_REFRESH_S)

    async def _fetch(self) -> None:
        table, _ = await call_async(lambda: self._manager.directory.remote())
        if table != self.table:  # an HMAC per key: only when a key was made or rotated
            self._by_id = {access_key_id(account, key): (account, key)
                           for account, keys in table.items() for key in keys}
            self.table = table

    async def fresh(self, force: bool = False) -> bool:
        """Refetch if due; returns whether a fetch ended meanwhile (this call's or one it
        shared). ``force`` (a request our copy refused) refetches once KEYS_MIN_REFRESH_S
        passed since the last fetch, waiting for that if need be: a key made or rotated
        just after a fetch still works at once."""
        return await self._copy.fresh(force)

    def forget(self) -> None:
        self._copy.forget()

    def get(self, account_or_key_id: str) -> list[str]:
        """The keys of an account, or the one key of an AKIA access key id."""
        if account_or_key_id in self._by_id:
            return [self._by_id[account_or_key_id][1]]
        return self.table.get(account_or_key_id, [])

    def account_of(self, signer):
        """``signer`` (a Claim or a Caller) naming its account, when it signed with an
        access key id."""
        found = self._by_id.get(signer.account)
        return replace(signer, account=found[0]) if found else signer


class SqsEndpoint:
    """One HTTP replica of the SQS endpoint, serving from its constructor on. After its
    first message request, a plain-HTTP connection moves to its queue's shard when that
    shard is on this host (:mod:`rayq.handoff`). Without a ``host`` it listens nowhere
    and hands nothing on: a shard runs one so to answer the connections handed to it.
    It takes its clock as the kit's actors do but stands apart from
    :class:`~actors.base.RuntimeActor`: it runs no background loop, nothing pings it (its
    ``ready`` answers once it listens), and a shard runs it as a plain object in its own
    process."""

    def __init__(self, host: str, port: int, manager, shards: list, config: Config,
                 clock: Clock | None = None, tls: tuple[str, str] | None = None,
                 home_region: str = HOME_REGION):
        self._manager, self._shards, self._config = manager, shards, config
        self.clock = clock or SystemClock()
        self.address = (host, port)
        self._clients: dict[str, tuple[AccountSigner, Client]] = {}
        self._clients_lock = threading.Lock()
        self._keys = Keys(manager, self.clock)
        self._api = SqsApi(self._client, ReplicaState(named(STATE), self.clock),
                           accounts=lambda: self._keys.table, home_region=home_region)
        self._pool = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="sqs")
        self._shares = Shares(in_flight_per_account=IN_FLIGHT_PER_ACCOUNT,
                              threads_per_account=THREADS_PER_ACCOUNT)
        self._budget = BodyBudget(MAX_BUFFERED_BYTES)
        self._unverified = Unverified(UNVERIFIED_PER_PEER)
        self._home_region = home_region
        self._doors = Doors(self._pool, self._door_of, MESSAGE_ACTIONS if host else (), host_id())
        self._served = asyncio.get_running_loop().create_task(self._listen(host, port, tls))

    async def _listen(self, host: str | None, port: int, tls: tuple[str, str] | None) -> None:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_S)
        await runner.setup()
        self.server = server = runner.server
        if host is None:
            return

        def connection():  # past the cap a connection is closed before it is read
            return server() if len(server.connections) < MAX_CONNECTIONS else _Refused()

        self._server = await asyncio.get_running_loop().create_server(
            connection, host, port, reuse_port=True, reuse_address=True, ssl=_tls_context(tls))

    async def ready(self) -> tuple[str, int]:
        """(host, port) once the server listens (raises if it could not bind)."""
        await self._served
        return self.address

    async def close(self) -> None:
        """Close every connection (a shard's, when the endpoint stops)."""
        await self._served
        await self._runner.cleanup()

    def stats(self) -> EndpointStats:
        return EndpointStats(len(self.server.connections), self._unverified.total(),
                             self._budget.held_bytes, self._shares.total_in_flight())

    async def _door_of(self, shard: int) -> tuple[str, str]:
        """(host id, path) of shard ``shard``'s door; the first ask starts an endpoint
        there (:func:`hosted`)."""
        start = partial(hosted, self._manager, self._shards, self._config, self._home_region)
        return await call_async(lambda: self._shards[shard].door.remote(start), NO_RETRY)

    def _client(self, caller: Caller) -> Client:
        """The one client of the caller's account (worker threads ask at once): one, so that
        the send path it binds is rekeyed with it after a rotation."""
        with self._clients_lock:
            entry = self._clients.get(caller.account)
            if entry is None:
                signer = AccountSigner(caller.account, caller.key)
                entry = self._clients[caller.account] = (
                    signer, Client(self._manager, self._shards, self._config, signer))
            entry[0].rekey(caller.key)
        return entry[1]

    async def _serve(self, request: web.Request) -> web.Response:
        # The query string as sent: yarl's query_string decodes what SigV4 signs encoded.
        query_string = request.raw_path.partition("?")[2]
        query = protocol.is_query(request.headers.get("Content-Type", ""), query_string,
                                  request.headers.get("X-Amz-Target", ""))
        try:
            headers = {k.lower(): ",".join(request.headers.getall(k))
                       for k in request.headers.keys()}
            found = await self._claim(headers, query_string)  # before the body is read
            signed = SignedRequest(request.method, request.path, query_string, headers, b"")
            caller, signed = await self._verified(request, signed, found)
            with self._shares.admit(caller.account):
                if query:
                    parse = partial(protocol.decode_query, signed.body, query_string,
                                    request.path, request.host)
                else:
                    parse = partial(decode_request, request.method,
                                    headers.get("x-amz-target", ""), signed.body)
                action, params = await off_loop(len(signed.body), self._pool, parse)
                base = f"{request.scheme}://{request.host}"
                result = await self._run(action, params, caller, base)
                return await self._doors.answer(
                    request, _reply(200, result, action if query else None), action,
                    partial(self._api.home_shard, action, params, caller, base))
        except SqsError as err:
            if err.code == "InvalidClientTokenId":
                self._keys.forget()  # the runtime refused a key our copy still had
            return _refusal(err, query)
        except Exception as err:  # a bug or a broken runtime: still an answer SDKs parse (and retry)
            failure = SqsError("InternalFailure", f"{type(err).__name__}: {err}", 500, sender=False)
            return _refusal(failure, query)

    async def _verified(self, request: web.Request, signed: SignedRequest,
                        found: Claim) -> tuple[Caller, SignedRequest]:
        """(the caller, the request with its body) once the signature is checked. Nothing
        shared is spent before that: a request that signed its body's hash (or has no
        body) is verified first, then its body read against the replica's budget; any
        other is read holding one of its peer's UNVERIFIED_PER_PEER, then verified."""
        size = announced_size(request.content_length, request.body_exists,
                              MAX_REQUEST_BYTES)
        payload_hash = signed_payload_hash(signed.headers) if size else EMPTY_SHA256
        if payload_hash is not None:
            caller = await self._verify(signed, found, payload_hash)
            with self._budget.hold(size):
                body = await self._body(request, size)
            check_payload(body, payload_hash)
            return caller, replace(signed, body=body)
        with self._unverified.hold(request.remote):
            signed = replace(signed, body=await self._body(request, size))
            return await self._verify(signed, found), signed

    async def _claim(self, headers: dict[str, str], query_string: str) -> Claim:
        """The claim of the Authorization header, or of the query string when presigned."""
        await self._keys.fresh()
        try:
            return self._keys.account_of(claim(headers, self._keys.get, self.clock.now(),
                                               query=query_string))
        except SqsError as err:
            if err.code != "InvalidClientTokenId" or not await self._keys.fresh(force=True):
                raise
            return self._keys.account_of(claim(headers, self._keys.get, self.clock.now(),
                                               query=query_string))  # an account made since

    async def _body(self, request: web.Request, size: int) -> bytes:
        """The body of ``size`` bytes (:func:`~rayq.sqs.admission.announced_size`), read within BODY_TIMEOUT_S.
        Raises SqsError (408 when slow)."""
        if not size:
            return b""
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):  # a timer, not a task of its own
                return await request.read()
        except asyncio.TimeoutError:
            raise SqsError("RequestTimeout", "The request body did not arrive within "
                           f"{BODY_TIMEOUT_S:.0f} s.", status=408) from None

    async def _verify(self, signed: SignedRequest, found: Claim,
                      payload_hash: str | None = None) -> Caller:
        """The caller (hashing a large body on a worker thread). Raises SqsError."""
        size = len(signed.body)
        try:
            return self._keys.account_of(
                await off_loop(size, self._pool, verify_claim, signed, found, payload_hash))
        except SqsError as err:
            if err.code != "SignatureDoesNotMatch" or not await self._keys.fresh(force=True):
                raise
            return self._keys.account_of(await off_loop(  # a key rotated since
                size, self._pool, verify, signed, self._keys.get, self.clock.now(),
                MAX_SKEW_S, payload_hash))

    async def _run(self, action: str, params, caller: Caller, base: str) -> dict:
        """The action's answer (:meth:`SqsApi.answer`), on the event loop or one of the
        account's threads; on the loop only once the account's client exists (a first
        client is made on a thread)."""
        return await self._api.answer(
            action, params, caller, base, partial(self._shares.in_thread, caller.account,
                                                  self._pool),
            on_loop=caller.account in self._clients)


async def hosted(manager, shards: list, config: Config, home_region: str) -> Served:
    """An endpoint that listens nowhere, run in a shard's process for the connections
    replicas hand that shard (rayq.handoff)."""
    endpoint = SqsEndpoint(None, 0, manager, shards, config, home_region=home_region)
    await endpoint.ready()
    return Served(endpoint.server, MAX_CONNECTIONS, endpoint.close)


def _tls_context(tls: tuple[str, str] | None) -> ssl.SSLContext | None:
    """A server context for (certificate, key) PEM files; None: plain HTTP."""
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*tls)
    return context


class _Refused(asyncio.Protocol):
    """A connection past MAX_CONNECTIONS: closed unread."""

    def connection_made(self, transport) -> None:
        transport.close()


def _reply(status: int, payload: dict, query_action: str | None = None,
           **headers: str) -> web.Response:
    """A JSON answer, or the Query protocol's XML one for ``query_action``; ``headers`` by
    name with ``_`` for ``-`` (x_amzn_query_error)."""
    request_id = str(uuid.uuid4())
    if query_action is not None:
        body, kind = protocol.encode_query(query_action, payload, request_id), XML_TYPE
    else:
        body, kind = json.dumps(payload).encode(), JSON_TYPE
    return web.Response(status=status, body=body, content_type=None,
                        headers={"Content-Type": kind, "x-amzn-RequestId": request_id,
                                 **{name.replace("_", "-"): v for name, v in headers.items()}})


def _refusal(err: SqsError, query: bool) -> web.Response:
    """An error in the protocol of its request."""
    if not query:
        return _reply(err.status, err.body(), x_amzn_query_error=err.query_error())
    request_id = str(uuid.uuid4())
    return web.Response(status=err.status, body=protocol.query_error(err, request_id),
                        content_type=None, headers={"Content-Type": XML_TYPE,
                                                    "x-amzn-RequestId": request_id})


SqsStateRemote = ray.remote(concurrency_groups=LIVENESS_GROUPS)(SqsState)
SqsEndpointRemote = ray.remote(SqsEndpoint)

# The SQS actors' internal methods: all their public ones. Neither takes a rayq signature
# (a replica verifies each request's SigV4 itself and calls the state and the shards for
# it); tests/unit/test_operations.py holds each table to its actor's public methods.
SQS_STATE_INTERNAL = frozenset({"settings", "save", "fifo_admit", "fifo_record", "fifo_release",
                                "forward", "record", "move_start", "move_list", "move_cancel",
                                "ping"})
SQS_ENDPOINT_INTERNAL = frozenset({"ready", "close", "stats"})
