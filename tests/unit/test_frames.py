"""The local channel's wire format (rayq.core.codec.frames): what a client's request and a
shard's reply carry across the socket, and what a stranger's bytes cannot do."""

import inspect
import pickle

import msgpack
import pytest

from rayq.core.auth.accounts import Signature
from rayq.core.codec import frames
from rayq.core.codec.frames import (HEADER, FrameError, FrameTooLarge, decode_reply, decode_request,
                              encode_failure, encode_reply, encode_request)
import rayq.channel  # noqa: F401  (its ChannelLost is one of the errors that travel)
import rayq.core.auth.accounts  # noqa: F401  (SignatureMismatch, ReplayedRequest)
from rayq.errors import (InvalidMessage, MessageTooLarge, Overloaded, QueueDisabled,
                         RayqError, ReceiptInvalid, RuntimeFailure, TaskError)

SIGNED = Signature("acme", "orders", "put", 1_700_000_000.25, "ab" * 16, "cd" * 32)


def body(frame: bytes) -> bytes:
    """The payload of one whole frame, checking its length header on the way."""
    (size,) = HEADER.unpack_from(frame)
    assert size == len(frame) - HEADER.size
    return frame[HEADER.size:]


def raw_frame(payload) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


class Exploit:
    """Unpickling this records that it happened: what a stranger would try."""

    unpickled = []

    def __reduce__(self):
        return Exploit.unpickled.append, ("unpickled",)


@pytest.fixture(autouse=True)
def _forget_exploits():
    Exploit.unpickled.clear()


# -- requests ---------------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs", [
    ((), {}),
    ((3, b"\x00\xffbatch"), {}),
    (([1, 2, 7], 10, 30.5), {"max_receives": 3, "dead_letter": None, "wait_s": 0.0}),
    (([["finish", ["r" * 64, b"outcome", None]], ["defer", ["r" * 64, 2.5]]],), {}),
    (("unicode é ✓",), {"keys": [["tenant", "type"]], "exclude": None}),
])
@pytest.mark.parametrize("auth", [None, SIGNED])
def test_a_request_decodes_to_what_was_encoded(args, kwargs, auth):
    frame = encode_request(41, "receive", args, kwargs, auth)
    call_id, method, got_args, got_kwargs, got_auth = decode_request(body(frame))
    assert (call_id, method, got_kwargs, got_auth) == (41, "receive", kwargs, auth)
    assert got_args == list(args)  # tuples travel as lists, as msgpack has no tuple


def test_a_signature_comes_back_as_a_signature():
    *_, auth = decode_request(body(encode_request(0, "put", (1, b"x"), {}, SIGNED)))
    assert isinstance(auth, Signature) and auth.timestamp == SIGNED.timestamp


@pytest.mark.parametrize("value", [ReceiptInvalid("no", ("r",)), Exploit()])
def test_a_request_cannot_carry_an_extension_type(value):
    with pytest.raises(InvalidMessage, match="cannot send"):
        encode_request(1, "put", (1, value), {}, None)


def test_a_request_carrying_a_pickle_extension_is_refused_unopened():
    payload = raw_frame([1, "put", [1, msgpack.ExtType(1, pickle.dumps(Exploit()))], {}, None])
    with pytest.raises(FrameError):
        decode_request(payload)
    assert Exploit.unpickled == []


def test_a_request_with_an_extension_of_another_code_is_refused_too():
    with pytest.raises(FrameError):
        decode_request(raw_frame([1, "put", [], {"x": msgpack.ExtType(42, b"?")}, None]))


MALFORMED = [
    pickle.dumps(Exploit()),                              # not msgpack at all
    b"",                                                  # nothing
    raw_frame([1, "put", [], {}]),                        # four fields
    raw_frame([1, "put", [], {}, None, "extra"]),         # six fields
    raw_frame({"id": 1, "method": "put"}),                # a map
    raw_frame("12345"),                                   # a string of five characters
    raw_frame(["1", "put", [], {}, None]),                # id not an int
    raw_frame([1, 7, [], {}, None]),                      # method not a string
    raw_frame([1, "put", "args", {}, None]),              # args not a list
    raw_frame([1, "put", [], [], None]),                  # kwargs not a map
    raw_frame([1, "put", [], {1: 2}, None]),              # a keyword that is not a string
    raw_frame([1, "put", [], {}, ["acme", "q"]]),         # auth of two fields
    raw_frame([1, "put", [], {}, "auth"]),                # auth not a list
    raw_frame([1, "put", [], {}, ["a", "q", "put", "t", "n", "m"]]),  # timestamp a string
    raw_frame([1, "put", [], {}, ["a", "q", "put", 1.0, "n", 7]]),    # mac an int
    raw_frame([1, "put", [], {}, None])[:-2],             # truncated
    b"\xc1",                                              # a byte msgpack never uses
]


@pytest.mark.parametrize("payload", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_request_raises_frame_error(payload):
    with pytest.raises(FrameError):
        decode_request(payload)
    assert Exploit.unpickled == []


def test_a_frame_error_is_a_value_error_not_a_rayq_error():
    # it never reaches a caller: the shard drops the connection it came on
    assert issubclass(FrameError, ValueError)


def test_a_request_over_the_frame_limit_raises_frame_too_large(monkeypatch):
    monkeypatch.setattr(frames, "MAX_FRAME_BYTES", 1000)
    decode_request(body(encode_request(1, "put", (1, b"x" * 900), {}, None)))
    with pytest.raises(FrameTooLarge):
        encode_request(1, "put", (1, b"x" * 1000), {}, None)


# -- replies ----------------------------------------------------------------------------
@pytest.mark.parametrize("result", [
    None, 0, -1, 2**63 - 1, 1.5, "text", b"\x00bytes", [], ["a", "b"],
    [["nested", [1, [2, [b"deep"]]]], None], {"sq": 3, "n": [1, 2]},
])
def test_a_result_decodes_to_what_was_encoded(result):
    assert decode_reply(body(encode_reply(9, result))) == (9, True, result)


def test_a_tuple_result_travels_as_a_list():
    assert decode_reply(body(encode_reply(9, ("id", 1))))[2] == ["id", 1]


def test_a_result_with_integer_keys_decodes():
    # counts answer {subqueue: n}: a reply (from the trusted shard) may key maps by int
    assert decode_reply(body(encode_reply(1, {3: 10, 4: 0})))[2] == {3: 10, 4: 0}


@pytest.mark.parametrize("error", [
    ReceiptInvalid("2 stale", ("a" * 64, "b" * 64)),
    QueueDisabled("retired"),
    MessageTooLarge("too big"),
    Overloaded("busy"),
    TaskError("KeyError", "'k'"),
    RuntimeFailure("runtime call failed"),
])
def test_a_rayq_error_survives_a_reply_as_the_failure(error):
    call_id, ok, got = decode_reply(body(encode_failure(5, error)))
    assert (call_id, ok, type(got), str(got)) == (5, False, type(error), str(error))
    assert vars(got) == vars(error)


def every_rayq_error(cls=RayqError):
    for sub in cls.__subclasses__():
        yield sub
        yield from every_rayq_error(sub)


def made_up(cls) -> Exception:
    """An instance of ``cls`` with a string for each argument its constructor requires."""
    required = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return cls(*(f"field {i}" for i in range(max(1, len(required)))))


@pytest.mark.parametrize("cls", sorted(set(every_rayq_error()), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_rayq_error_class_survives_a_reply(cls):
    # a class that pickles but does not unpickle (a required __init__ argument it does not
    # pass to Exception) would end the client's channel, and the retry would run the call
    # again: every one must come back as itself
    error = made_up(cls)
    _, ok, got = decode_reply(body(encode_failure(1, error)))
    assert not ok and type(got) is cls and vars(got) == vars(error) and str(got) == str(error)
    _, ok, [inside] = decode_reply(body(encode_reply(1, [error])))
    assert type(inside) is cls and vars(inside) == vars(error)


def test_receipt_invalid_keeps_its_receipts_as_a_failure():
    _, _, got = decode_reply(body(encode_failure(5, ReceiptInvalid("stale", ("r1", "r2")))))
    assert got.receipts == ("r1", "r2")


def test_rayq_errors_inside_a_result_list_come_back_as_themselves():
    # end_many answers one value or RayqError per call
    results = [None, "new-receipt", ReceiptInvalid("stale", ("r" * 64,)), QueueDisabled("gone")]
    _, ok, got = decode_reply(body(encode_reply(2, results)))
    assert ok and got[:2] == [None, "new-receipt"]
    assert isinstance(got[2], ReceiptInvalid) and got[2].receipts == ("r" * 64,)
    assert isinstance(got[3], QueueDisabled) and str(got[3]) == "gone"


def test_a_result_that_cannot_travel_raises_type_error():
    with pytest.raises(TypeError):
        encode_reply(1, object())


def test_many_frames_in_one_buffer_split_by_their_headers():
    frames = b"".join(encode_reply(i, [i] * i) for i in range(5))
    seen = []
    while frames:
        (size,) = HEADER.unpack_from(frames)
        seen.append(decode_reply(frames[HEADER.size:HEADER.size + size]))
        frames = frames[HEADER.size + size:]
    assert seen == [(i, True, [i] * i) for i in range(5)]
