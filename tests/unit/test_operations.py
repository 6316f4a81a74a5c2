"""The table of signed operations: it covers every signed actor method, a signature
holds for one operation and one set of arguments only, and arguments bind by name. With
each actor's table of internal methods it covers every public method of the actor."""

import asyncio
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from rayq.core.auth.accounts import ADMIN, Accounts, Place, Signer
from rayq.core.auth.gate import UNSIGNED, Caller, Gate, signed
from rayq.channel import CHANNEL_METHODS
from rayq.core.auth.operations import (COORDINATOR_INTERNAL, COORDINATOR_OPS, FLOOD_INTERNAL,
                                       MANAGER_INTERNAL, MANAGER_OPS, OPERATIONS, SHARD_INTERNAL,
                                       SHARD_OPS, Scope, of_actor, parameters)
from rayq.core.codec.model import ROW_KEY, Receipt
from rayq.errors import AuthError, InvalidMessage
from rayq.testing import MemoryKV

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACTOR_CLASSES = {"shard": "actors.shard:ShardActor", "manager": "actors.manager:QueueManager",
                 "coordinator": "actors.coordinator:FairnessCoordinator",
                 "flood": "actors.flood:FloodDetector"}

# Imports the actor modules in a fresh interpreter (unit tests keep ray out of this
# one) and lists every method of every class there that takes ``auth``, with the
# operation its ``@signed`` carries.
_INTROSPECT = """
import importlib, inspect, json, pkgutil, actors
found = {}
for info in pkgutil.iter_modules(actors.__path__):
    module = importlib.import_module("actors." + info.name)
    for cls_name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or "auth" not in inspect.signature(fn).parameters:
                continue
            op = getattr(fn, "operation", None)
            found[f"{module.__name__}:{cls_name}.{name}"] = op.name if op else None
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def signed_methods() -> dict:
    out = subprocess.run([sys.executable, "-c", _INTROSPECT], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_actor_method_taking_auth_is_an_entry_of_the_table(signed_methods):
    expected = {f"{ACTOR_CLASSES[op.actor]}.{op.method}": op.name for op in OPERATIONS.values()}
    assert signed_methods == expected


# Each actor's table of internal methods, by its name in the operations table.
INTERNAL = {"shard": SHARD_INTERNAL, "manager": MANAGER_INTERNAL,
            "coordinator": COORDINATOR_INTERNAL, "flood": FLOOD_INTERNAL}
_SQS_TABLES = {"rayq.sqs.service:SqsState": "SQS_STATE_INTERNAL",
               "rayq.sqs.service:SqsEndpoint": "SQS_ENDPOINT_INTERNAL"}

# In a fresh interpreter, as above: each class's public methods (its own and those it
# inherits), each with the operation its ``@signed`` carries (None: unsigned), and the
# SQS actors' internal tables (their module imports ray).
_PUBLIC = """
import importlib, inspect, json, sys
classes, sqs_tables = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def loaded(path):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)
public = {path: {name: getattr(getattr(fn, "operation", None), "name", None)
                 for name, fn in inspect.getmembers(loaded(path), inspect.isfunction)
                 if not name.startswith("_")}
          for path in [*classes, *sqs_tables]}
tables = {path: sorted(loaded(path.split(":")[0] + ":" + table))
          for path, table in sqs_tables.items()}
print(json.dumps([public, tables]))
"""


@pytest.fixture(scope="module")
def public_methods() -> tuple[dict, dict]:
    """(class path -> {public method: its operation's name or None}, SQS class path -> its
    internal table)."""
    args = [json.dumps(list(ACTOR_CLASSES.values())), json.dumps(_SQS_TABLES)]
    out = subprocess.run([sys.executable, "-c", _PUBLIC, *args], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    public, tables = json.loads(out.stdout.strip().splitlines()[-1])
    return public, tables


@pytest.mark.parametrize("actor", sorted(ACTOR_CLASSES))
def test_every_public_method_of_an_actor_is_signed_or_in_its_internal_table(public_methods,
                                                                            actor):
    methods = public_methods[0][ACTOR_CLASSES[actor]]
    signed_here = {name: op for name, op in methods.items() if op is not None}
    assert signed_here == {method: op.name for method, op in of_actor(actor).items()}
    assert set(methods) - set(signed_here) == INTERNAL[actor]


@pytest.mark.parametrize("path", sorted(_SQS_TABLES))
def test_every_public_method_of_an_sqs_actor_is_in_its_internal_table(public_methods, path):
    public, tables = public_methods
    assert all(op is None for op in public[path].values())
    assert sorted(public[path]) == tables[path]


def test_no_method_is_both_signed_and_internal():
    for actor, internal in INTERNAL.items():
        assert not internal & set(of_actor(actor)), actor


def test_the_local_channel_serves_no_internal_method_of_a_shard():
    assert CHANNEL_METHODS & SHARD_INTERNAL == set()
    assert CHANNEL_METHODS <= set(SHARD_OPS)


def test_the_table_shape():
    assert {op.actor for op in OPERATIONS.values()} == set(ACTOR_CLASSES)
    for op in OPERATIONS.values():
        assert op.name == f"{op.actor}.{op.method}"
        touching = op.subqueues or op.receipts
        assert bool(touching) == (op.scope is Scope.SUBQUEUES), op.name
        assert set(op.subqueues + op.receipts) <= set(op.params), op.name
        assert not op.queue or op.scope is Scope.ACCOUNT, op.name
    admin = {op.name for op in OPERATIONS.values() if op.admin_only}
    assert {"manager.create_account", "manager.rotate_key", "shard.stats", "shard.end_many",
            "coordinator.suspend", "flood.flooders_now"} <= admin
    assert not admin & {"shard.put", "manager.whoami", "manager.create_queue"}


@pytest.fixture
def world():
    accounts = Accounts(MemoryKV())
    places = {1: Place("acme/jobs", "acme", 0), 2: Place("acme/jobs", "acme", 0),
              3: Place("globex/jobs", "globex", 0)}

    async def fetch():
        return accounts.table(), dict(places)
    signers = {name: Signer(name, accounts.create(name)) for name in ("acme", "globex")}
    signers[ADMIN] = Signer(ADMIN, accounts.rotate(ADMIN, 1))  # default has no keys until given
    return fetch, signers


def admit(fetch, operation, auth, *args, **kwargs):
    gate = Gate(fetch, shard=0)
    return asyncio.run(gate.admit(operation, auth, operation.bind(*args, **kwargs)))


def test_a_signature_for_one_operation_fails_for_another(world):
    fetch, signers = world
    flush = signers[ADMIN].sign(SHARD_OPS["flush_events"])
    assert admit(fetch, SHARD_OPS["flush_events"], flush) == ADMIN
    for other in (COORDINATOR_OPS["flush_events"], SHARD_OPS["stats"], SHARD_OPS["noisy"]):
        with pytest.raises(AuthError, match="another queue or operation"):
            admit(fetch, other, flush)
    peek = signers["acme"].sign(SHARD_OPS["peek"], 1, queue="jobs")
    with pytest.raises(AuthError):
        admit(fetch, SHARD_OPS["clear"], peek, 1)


@pytest.mark.parametrize("signed_args, called_args", [
    ((1, b"x"), (2, b"x")),            # another subqueue
    ((1, b"x"), (1, b"y")),            # another body
])
def test_a_signature_for_one_argument_set_fails_for_another(world, signed_args, called_args):
    fetch, signers = world
    put = SHARD_OPS["put"]
    auth = signers["acme"].sign(put, *signed_args, queue="jobs")
    with pytest.raises(AuthError, match="does not match"):
        admit(fetch, put, auth, *called_args)
    assert admit(fetch, put, auth, *signed_args) == "acme"


def test_account_operations_are_signed_for_the_queue_their_arguments_name(world):
    fetch, signers = world
    create = MANAGER_OPS["create_queue"]
    auth = signers["acme"].sign(create, "jobs", 2)
    assert auth.queue == "jobs"
    with pytest.raises(AuthError):
        admit(fetch, create, auth, "other", 2)
    with pytest.raises(AuthError):  # the same queue, another subqueue count
        admit(fetch, create, auth, "jobs", 3)
    assert admit(fetch, create, auth, "jobs", subqueues=2, max_receives=5) == "acme"


def test_arguments_bind_by_name_with_defaults():
    receive = SHARD_OPS["receive"]
    positional = receive.bind([1, 2], 5, 30)
    by_name = receive.bind(subqueue=[1, 2], max_messages=5, visibility_timeout_s=30,
                           keys=None, wait_s=0.0)
    assert positional == by_name and receive.body(positional) == receive.body(by_name)
    assert positional["wait_s"] == 0.0 and positional["dead_letter"] is None
    assert receive.body(receive.bind([1, 2], 5, 30, wait_s=1.0)) != receive.body(positional)
    with pytest.raises(InvalidMessage):
        receive.bind([1], 5, 30, None)  # keys is keyword-only
    with pytest.raises(InvalidMessage):
        receive.bind([1], surprise=1)


def test_a_signature_made_with_positional_arguments_holds_for_the_same_call_by_name(world):
    fetch, signers = world
    receive = SHARD_OPS["receive"]
    auth = signers["acme"].sign(receive, [1, 2], 5, 30, wait_s=2.0, queue="jobs")
    assert admit(fetch, receive, auth, subqueue=[1, 2], visibility_timeout_s=30,
                 max_messages=5, wait_s=2.0, exclude=None) == "acme"


def test_a_call_is_refused_when_it_touches_another_accounts_subqueues(world):
    fetch, signers = world
    receive, delete = SHARD_OPS["receive"], SHARD_OPS["delete"]
    for args, kwargs in ((([1, 3],), {}), (([1],), {"dead_letter": 3})):
        auth = signers["acme"].sign(receive, *args, queue="jobs", **kwargs)
        with pytest.raises(AuthError):
            admit(fetch, receive, auth, *args, **kwargs)
    foreign = Receipt(ROW_KEY.pack(3, 0, 0, 0), bytes(8)).encode()
    auth = signers["acme"].sign(delete, [foreign], queue="jobs")
    with pytest.raises(AuthError):
        admit(fetch, delete, auth, [foreign])


@pytest.mark.parametrize("name, args, touched", [
    ("shard.receive", ([1, 2],), [1, 2]),
    ("shard.receive", (1,), [1]),
    ("shard.receive", ([1],), [1]),
    ("shard.depths", (None,), []),          # None is its default: a whole-shard read
    ("shard.counts", (None,), [None]),      # not a list of ids: refused at the gate
    ("shard.delete", (["not a receipt"],), []),  # malformed: the store refuses it
    ("shard.put", (7, b""), [7]),
])
def test_what_a_call_touches(name, args, touched):
    op = OPERATIONS[name]
    assert op.touched(op.bind(*args)) == touched


def test_the_dead_letter_subqueue_of_a_receive_is_touched_too():
    receive = SHARD_OPS["receive"]
    assert receive.touched(receive.bind([1], dead_letter=9)) == [1, 9]


def test_parameters_use_python_syntax_and_refuse_reserved_names():
    sig = parameters("a, b=1, *, c=None, d='x'")
    assert str(sig) == "(a, b=1, *, c=None, d='x')"
    for reserved in ("auth", "caller", "queue"):
        with pytest.raises(ValueError):
            parameters(reserved)


def test_signed_methods_are_checked_against_their_entry_at_import():
    with pytest.raises(TypeError, match="shard.clear"):
        @signed(SHARD_OPS["clear"])
        async def clear(self, subqueue, extra): ...
    with pytest.raises(TypeError, match="shard.peek"):
        @signed(SHARD_OPS["peek"])
        async def peek(self, subqueue, max_messages=2, *, keys=None): ...  # another default
    with pytest.raises(TypeError, match="keyword-only"):
        @signed(SHARD_OPS["clear"])
        async def clear_too(self, subqueue, caller): ...


def test_a_signed_method_admits_its_caller_before_it_runs(world):
    fetch, signers = world

    class Shard:
        def __init__(self):
            self.gate = Gate(fetch, shard=0)

        @signed(SHARD_OPS["clear"])
        async def clear(self, subqueue: int, *, caller: Caller) -> Caller:
            return caller

        @signed(SHARD_OPS["stats"])
        async def stats(self) -> str:
            return "stats"

    assert list(inspect.signature(Shard.clear).parameters) == ["self", "subqueue", "auth"]
    # Ray reads the innermost function of a __wrapped__ chain: it must be the public one
    assert "caller" not in inspect.signature(inspect.unwrap(Shard.clear)).parameters
    shard, clear = Shard(), SHARD_OPS["clear"]
    assert asyncio.run(shard.clear(1)) is UNSIGNED
    auth = signers["acme"].sign(clear, 1, queue="jobs")
    assert asyncio.run(shard.clear(1, auth=auth)) == Caller("acme", auth)
    with pytest.raises(AuthError, match="replayed"):
        asyncio.run(shard.clear(1, auth=auth))
    with pytest.raises(AuthError):
        asyncio.run(shard.clear(3, auth=signers["acme"].sign(clear, 3, queue="jobs")))
    with pytest.raises(AuthError, match="default"):
        asyncio.run(shard.stats(auth=signers["acme"].sign(SHARD_OPS["stats"])))
    assert asyncio.run(shard.stats(auth=signers[ADMIN].sign(SHARD_OPS["stats"]))) == "stats"


_SIGNATURES = [inspect.signature(f) for f in (
    lambda a, b=1, *, c=None: None,
    lambda a, b, c=3: None,
    lambda *, k, auth=None: None,
    lambda a, *rest, **more: None,
)] + [op.signature for op in OPERATIONS.values()]


@pytest.mark.parametrize("signature", _SIGNATURES, ids=str)
def test_binder_binds_as_inspect_does(signature):
    """Binder's fast path answers exactly what inspect's bind + apply_defaults answers,
    and refuses (TypeError) exactly what inspect refuses."""
    from rayq.core.auth.operations import Binder

    names = list(signature.parameters) + ["stray"]
    binder = Binder(signature)
    cases = [((), {})] + [(tuple(range(n)), {}) for n in range(1, len(names) + 2)]
    for n in range(len(names)):
        for chosen in (names[n:], names[:n], names[::2], [names[n]]):
            cases += [((), dict.fromkeys(chosen, "v")), ((0,), dict.fromkeys(chosen, "v"))]
    for args, kwargs in cases:
        try:
            expected = signature.bind(*args, **kwargs)
        except TypeError:
            with pytest.raises(TypeError):
                binder(args, kwargs)
            continue
        expected.apply_defaults()
        got = binder(args, kwargs)
        assert got == dict(expected.arguments) and list(got) == list(expected.arguments)
