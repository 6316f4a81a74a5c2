"""Messages, receipts and the codecs between user values and stored bytes.

The store only sees bytes and timestamps; everything that knows msgpack, body
types, fairness keys or limits lives here.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import msgpack

from rayq.core.codec.values import VALUES_TAG, decode as decode_values
from rayq.errors import InvalidMessage, MessageTooLarge, ReceiptInvalid

US = 1_000_000
ALL_TENANTS = "*"  # a flooder entry naming every tenant of a type
MAX_NAME_CHARS = 128
# Explicit limits for every msgpack decode of untrusted bytes.
_UNPACK_LIMITS = dict(max_str_len=16 << 20, max_bin_len=16 << 20,
                      max_array_len=1 << 20, max_map_len=1 << 20, max_ext_len=0)

# Body tags: the first byte of an encoded body says how to give it back (a task's body
# may also be a values body, tag VALUES_TAG: rayq.core.codec.values).
_BYTES, _STR, _PACKED = 0, 1, 2
PACKED_TAG = _PACKED


def to_us(seconds: float) -> int:
    return int(round(seconds * US))


def at_s(at_us: int) -> float | None:
    """A stored time (µs since the epoch, 0: never) in seconds, None for never."""
    return at_us / US if at_us else None


def encode_body(body: Any, max_bytes: int) -> bytes:
    """Encode a body (bytes, str or a msgpack-able value) for storage.

    Raises InvalidMessage when the value cannot be packed, MessageTooLarge over
    ``max_bytes``.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes([_BYTES]) + bytes(body)
    elif isinstance(body, str):
        data = bytes([_STR]) + body.encode("utf-8", "surrogatepass")
    else:
        try:
            packed = msgpack.packb(body, use_bin_type=True, strict_types=False)
        except (TypeError, ValueError, OverflowError) as err:
            raise InvalidMessage(f"body is not bytes, str or a msgpack-able value: {err}") from err
        unpack(packed)  # refuse at send what could never be received (e.g. tuple map keys)
        data = bytes([_PACKED]) + packed
    if len(data) - 1 > max_bytes:
        raise MessageTooLarge(f"body is {len(data) - 1} bytes; the limit is {max_bytes}")
    return data


def decode_body(data: bytes) -> Any:
    """Give back the value :func:`encode_body` was given. Raises InvalidMessage."""
    if not data:
        raise InvalidMessage("empty encoded body")
    if data[0] == VALUES_TAG:  # a task's call of values beyond msgpack's, read in place
        return decode_values(data)
    tag, payload = data[0], data[1:]
    if tag == _BYTES:
        return bytes(payload)
    if tag == _STR:
        try:
            return payload.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as err:
            raise InvalidMessage(f"str body is not UTF-8: {err}") from err
    if tag == _PACKED:
        return unpack(payload)
    raise InvalidMessage(f"unknown body tag {tag}")


DLQ_SUFFIX = "-dlq"  # a queue's dead-letter queue is named <queue>-dlq


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Decode untrusted msgpack with explicit limits. Raises InvalidMessage."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, **_UNPACK_LIMITS)
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData) as err:
        raise InvalidMessage(f"malformed msgpack: {err}") from err


MAX_PRIORITY = 9


def check_priority(value: Any) -> int:
    """A message's priority: an int from 0 (the default) to MAX_PRIORITY. Among one
    fairness key's ready messages a higher priority is received first; between keys,
    fairness decides (docs/fair-dispatch.md). Raises InvalidMessage."""
    if type(value) is not int or not 0 <= value <= MAX_PRIORITY:
        raise InvalidMessage(f"priority must be an int from 0 to {MAX_PRIORITY}, got {value!r}")
    return value


def check_name(value: Any, what: str) -> str:
    """A tenant, type or queue name: a non-empty printable str up to 128 chars."""
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"{what} must be a non-empty str, got {value!r}")
    if len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise InvalidMessage(f"{what} must be printable and at most {MAX_NAME_CHARS} chars")
    return value


MAX_KEY_BYTES = 400  # LMDB keys hold at most 511 bytes


def check_key(value: Any) -> str:
    """A fairness key: a non-empty str of at most 400 UTF-8 bytes."""
    if not isinstance(value, str) or not value or len(value.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidMessage(f"a fairness key must be a non-empty str of at most {MAX_KEY_BYTES} bytes")
    return value


def check_seconds(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidMessage(f"{what} must be a number of seconds, got {value!r}")
    if not low <= value <= high:
        raise InvalidMessage(f"{what} must be within [{low}, {high}] seconds, got {value}")
    return float(value)


ID_TAG_BYTES = 8


def message_id(store_hex: str, id_key: bytes, seq: int) -> str:
    """A message's id: its store, its seq (rows stay ordered by seq; the id is never
    parsed back but by :func:`seq_of`, where an outcome expires) and a tag keyed with
    the store's secret ``id_key``, so that knowing one id does not tell another (a
    task's id is what its outcome is read by)."""
    return MessageIds(store_hex, id_key)(seq)


class MessageIds:
    """:func:`message_id` for one store: the keyed hash state is made once and copied
    for each id (a keyed BLAKE2b spends one compression on its key)."""

    __slots__ = ("_prefix", "_keyed")

    def __init__(self, store_hex: str, id_key: bytes):
        self._prefix = store_hex + "-"
        self._keyed = hashlib.blake2b(key=id_key, digest_size=ID_TAG_BYTES)

    def __call__(self, seq: int) -> str:
        tag = self._keyed.copy()
        tag.update(seq.to_bytes(8, "big"))
        return f"{self._prefix}{seq:x}-{tag.hexdigest()}"


DEFAULT_ACCOUNT = "default"  # the admin account: every unsigned client acts as it


def seq_of(message_id: str) -> int:
    """The seq of a message id this store made (an outcome's: its task's records are
    keyed by seq)."""
    return int(message_id.split("-")[1], 16)


MAX_WAIT_S = 20.0  # the longest a receive parks, as SQS's WaitTimeSeconds
MAX_BATCH = 1000   # messages one put, receive or delete carries (one send_batch, one submit_many)


def long_poll_s(wait_s: Any) -> float:
    """How long a receive asked to wait ``wait_s`` parks: at most MAX_WAIT_S, so that a
    caller cannot park one forever. Raises InvalidMessage for a negative, NaN or
    non-numeric wait."""
    return min(check_seconds(wait_s or 0.0, "wait_s", 0.0, float("inf")), MAX_WAIT_S)


def check_count(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidMessage(f"{what} must be an int within [{low}, {high}], got {value!r}")
    return value


MAX_SUBQUEUE = 2**32 - 2


def check_subqueue(subqueue: Any) -> int:
    """A subqueue id: an int that fits the row key's 4 bytes."""
    return check_count(subqueue, "subqueue", 0, MAX_SUBQUEUE)


def fairness_key(tenant: str, type_: str, mode: str) -> str:
    """The key fairness is computed over: the job type, the tenant or both."""
    if mode == "type":
        return type_
    if mode == "tenant":
        return tenant
    return f"{tenant}/{type_}"


@dataclass(frozen=True)
class Signature:
    """What travels with a signed request besides its arguments (:mod:`rayq.core.auth`
    makes and checks it; frames carry it)."""

    account: str
    queue: str
    operation: str
    timestamp: float
    nonce: str
    mac: str


@dataclass(frozen=True)
class KeyDepth:
    """Depth and latency of one fairness key in one subqueue.

    latency_s: how long the oldest visible message has been visible (0 when none is).
    oldest_enqueued_at: when that message (or, with none visible, the next) was enqueued.
    oldest_age_s: the age of the oldest visible message since its enqueue (0 when none
    is visible).
    oldest_ready_at: when that message could first be received: its enqueue, plus its
    delay while it was never received (a delayed message does not wait while delayed).
    """

    subqueue: int
    key: str
    count: int
    latency_s: float
    oldest_enqueued_at: float | None
    oldest_age_s: float = 0.0
    oldest_ready_at: float | None = None


@dataclass(frozen=True)
class Outgoing:
    """One message of a ``send_batch``: the body plus its attributes (``tenant`` None:
    the sending client's account)."""

    body: Any
    tenant: str | None = None
    type: str = "default"
    delay_s: float = 0.0
    ttl_s: float | None = None
    key: str | None = None  # None: the runtime's fairness key; else the message's group
    # (taken by an ordered queue, and by a plain queue the sending account owns)
    priority: int = 0  # 0..9: higher is received first among its key's ready messages


@dataclass(frozen=True)
class NewMessage:
    """A validated message ready for a shard: the body is already encoded."""

    body: bytes
    tenant: str
    type: str
    key: str
    delay_s: float = 0.0
    ttl_s: float | None = None
    task: bool = False          # the store records how a task message ended (its outcome)
    priority: int = 0           # 0..MAX_PRIORITY (see check_priority)


@dataclass(frozen=True)
class StoredMessage:
    """A message as a shard returns it; ``body`` is still encoded."""

    id: str
    receipt: str | None
    body: bytes
    tenant: str
    type: str
    key: str
    dequeue_count: int
    enqueued_at: float
    subqueue: int
    first_received_at_s: float | None = None  # when a receive first took it; None: never


@dataclass(frozen=True)
class Received:
    """A message as a user receives it: ``body`` is the value that was sent."""

    id: str
    receipt: str | None
    body: Any
    tenant: str
    type: str
    dequeue_count: int
    enqueued_at: float
    first_received_at_s: float | None = None  # when a receive first took it; None: never

    @classmethod
    def from_stored(cls, m: StoredMessage) -> "Received":
        return cls(m.id, m.receipt, decode_body(m.body), m.tenant, m.type,
                   m.dequeue_count, m.enqueued_at, m.first_received_at_s)


class SubqueueState(Enum):
    """What a subqueue accepts (docs/shards-and-storage.md): everything, no new puts
    (draining), nothing."""

    ALL = "all"
    NO_PUT = "no_put"
    DISABLED = "disabled"


# -- rows -------------------------------------------------------------------
# Row keys sort by (subqueue, key id, visible_at µs, seq): the oldest visible
# message of one fairness key in one subqueue is the first row of its prefix.
ROW_KEY = struct.Struct(">IIQQ")
PREFIX = struct.Struct(">II")


class CountKind(str, Enum):
    """Where the messages of a shard's tenant count are: live rows or the spill store.
    A str value, so a count travels to policy as plain data."""

    LIVE = "L"
    SPILLED = "S"


class TenantCount(NamedTuple):
    """The name of one of a shard's tenant counts: (kind, subqueue, type, tenant)."""

    kind: CountKind
    subqueue: int
    type: str
    tenant: str


class Ending(Enum):
    """How a task message left its queue, as recorded in the shard's outcomes table."""

    RESULT = 1        # a consumer finished it; the payload is its encoded outcome
    DEAD = 2          # dead-lettered after max_receives; the payload is empty
    EXPIRED = 3       # its time to live ran out before anyone finished it
    DELETED = 4       # deleted or cleared without a result
    CANCELLED = 5     # withdrawn by client.cancel: before it ran, or stopped while it ran


# -- receipts ----------------------------------------------------------------
_RECEIPT = struct.Struct(">IIQQ8s")
RECEIPT_CHARS = 2 * _RECEIPT.size


def receipt_text(row_key: bytes, nonce: bytes) -> str:
    """A pop receipt as users hold it: the row key and the nonce, in hex."""
    return (row_key + nonce).hex()


def parse_receipt(text: Any) -> tuple[bytes, bytes]:
    """(row key, nonce) of a receipt string. Raises ReceiptInvalid when it is not one."""
    if not isinstance(text, str) or len(text) != RECEIPT_CHARS:
        raise ReceiptInvalid(f"not a pop receipt: {text!r:.80}")
    try:
        raw = bytes.fromhex(text)
    except ValueError as err:
        raise ReceiptInvalid(f"not a pop receipt: {text!r:.80}") from err
    if len(raw) != _RECEIPT.size:  # fromhex skips white space
        raise ReceiptInvalid(f"not a pop receipt: {text!r:.80}")
    return raw[:ROW_KEY.size], raw[ROW_KEY.size:]


def receipt_subqueue(text: Any) -> int:
    """The subqueue a receipt string points into (its first 4 bytes), to route it; the
    shard checks the rest. Raises ReceiptInvalid when it is not shaped like one."""
    if not isinstance(text, str) or len(text) != RECEIPT_CHARS:
        raise ReceiptInvalid(f"not a pop receipt: {text!r:.80}")
    try:
        return int(text[:8], 16)
    except ValueError as err:
        raise ReceiptInvalid(f"not a pop receipt: {text!r:.80}") from err


@dataclass(frozen=True)
class Receipt:
    """A pop receipt: where the received row now lives and the nonce of that receive."""

    row_key: bytes
    nonce: bytes

    def encode(self) -> str:
        return receipt_text(self.row_key, self.nonce)

    @classmethod
    def decode(cls, text: Any) -> "Receipt":
        """Parse a receipt string. Raises ReceiptInvalid when it is not one."""
        return cls(*parse_receipt(text))

    @property
    def subqueue(self) -> int:
        return ROW_KEY.unpack(self.row_key)[0]
