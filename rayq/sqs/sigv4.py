"""AWS Signature Version 4 verification, server side (pure; time is passed in).

boto3 signs every SQS request with SigV4: an HMAC chain over a canonical form of
the request. The endpoint recomputes it with each of the account's keys (the
access key id is the account name, the secret its rayq key) and compares with
``hmac.compare_digest``. A request is signed in its ``Authorization`` header (what
SDKs send) or presigned: the signature and its scope in ``X-Amz-*`` query parameters,
valid for ``X-Amz-Expires`` seconds (a URL handed to someone without the key).

Written here rather than borrowed from botocore: botocore's signer is a client's.
It reads the clock itself, picks which headers to sign, and rebuilds the request
from an ``AWSRequest``; a verifier must take the signed-header list the caller
chose, the headers as they arrived, and an injected time. The canonical form is
small; tests check it against botocore's signer.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from urllib.parse import parse_qsl, quote

from rayq.sqs.errors import SqsError
from rayq.sqs.names import valid_region

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 900.0
# Headers the endpoint acts on, so the signature must cover them (botocore signs them):
# the action (x-amz-target), the time (x-amz-date) and how the body is read.
REQUIRED_SIGNED = ("host", "x-amz-date", "x-amz-target", "content-type")
# A presigned request's query parameters; all but the security token are required.
PRESIGN_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                  "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token")
_REQUIRED_PARAMS = PRESIGN_PARAMS[:6]
MAX_EXPIRES_S = 604_800  # a presigned request is valid for at most a week
_MAX_EXPIRES_DIGITS = len(str(MAX_EXPIRES_S))  # checked before int(), which refuses 4 300
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()  # an empty body's: signed before it is read
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_AUTH = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),"
                   r"\s*Signature=([0-9a-f]{64})\s*$")


@dataclass(frozen=True)
class SignedRequest:
    """What a signature covers: method, path, raw query, headers (lower-case names,
    values joined with ',' when repeated) and the body."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Caller:
    """Who signed a request: the account, the key that matched, the region signed for."""

    account: str
    key: str
    region: str


def _missing(message: str = "Request is missing Authentication Token") -> SqsError:
    return SqsError("MissingAuthenticationToken", message, status=403)


def _incomplete(message: str) -> SqsError:
    return SqsError("IncompleteSignature", message, status=400)


def _mismatch(message: str) -> SqsError:
    return SqsError("SignatureDoesNotMatch", message, status=403)


@dataclass(frozen=True)
class Claim:
    """What a request's ``Authorization`` and ``X-Amz-Date`` headers claim, checked
    before its body is read: a known account, a well-formed scope, a fresh timestamp,
    and the headers the endpoint acts on among the signed ones."""

    account: str
    date: str
    region: str
    service: str
    stamp: str
    signed_names: tuple[str, ...]
    signature: str
    keys: tuple[str, ...]
    presigned: bool = False  # signed in the query string, not the Authorization header


def claim(headers: Mapping[str, str], keys: Callable[[str], Sequence[str]], now: float,
          skew_s: float = MAX_SKEW_S, query: str = "") -> Claim:
    """The claim of a request's headers (lower-case names), or of its raw ``query`` string
    when presigned. Raises SqsError (MissingAuthenticationToken, IncompleteSignature,
    InvalidClientTokenId, SignatureDoesNotMatch, or for a presigned one
    InvalidParameterCombination, InvalidQueryParameter, RequestExpired) for a missing,
    malformed, unknown or stale one."""
    if "X-Amz-" in query:  # the one test a header-signed request pays
        params = _presign_params(query)
        if params:
            return _presigned_claim(params, headers, keys, now, skew_s)
    header = headers.get("authorization")
    if not header:
        raise _missing()
    match = _AUTH.match(header)
    if match is None:
        raise _incomplete("Authorization header requires Credential, SignedHeaders and "
                          f"Signature parameters of {ALGORITHM}")
    credential, signed_names, signature = match.groups()
    account, date, region, service = _scope(credential)
    stamp = _timestamp(headers.get("x-amz-date", ""), date, now, skew_s)
    names = tuple(name.lower() for name in signed_names.split(";"))
    # A Query-protocol request has no x-amz-target: its action is in the signed body or
    # query string; a request that carries the header must sign it.
    required = [n for n in REQUIRED_SIGNED if n != "x-amz-target" or "x-amz-target" in headers]
    unsigned = [name for name in required if name not in names]
    if unsigned:  # else a captured request could be replayed as another action
        raise _incomplete(f"SignedHeaders must include {', '.join(unsigned)}")
    keys_now = _keys_of(account, service, keys)
    return Claim(account, date, region, service, stamp, names, signature, keys_now)


def _keys_of(account: str, service: str, keys: Callable[[str], Sequence[str]]) -> tuple[str, ...]:
    """The keys a signature of ``account`` for ``service`` may have been made with."""
    keys_now = tuple(keys(account))
    if not keys_now:
        raise SqsError("InvalidClientTokenId",
                       "The security token included in the request is invalid.", status=403)
    if service != SERVICE:
        raise _mismatch(f"Credential should be scoped to correct service: '{SERVICE}'.")
    return keys_now


def _presign_params(query: str) -> dict[str, str]:
    """The presigning parameters of a raw query string (none: not presigned)."""
    return {name: value for name, value in parse_qsl(query, keep_blank_values=True)
            if name in PRESIGN_PARAMS}


def _presigned_claim(params: Mapping[str, str], headers: Mapping[str, str],
                     keys: Callable[[str], Sequence[str]], now: float, skew_s: float) -> Claim:
    """The claim of a presigned request's query parameters: all present, the scope
    well-formed, ``now`` within [X-Amz-Date - skew_s, X-Amz-Date + X-Amz-Expires]."""
    if "authorization" in headers:
        raise SqsError("InvalidParameterCombination", "A request is signed either in its "
                       "Authorization header or in its query string (X-Amz-Signature), "
                       "not both.")
    missing = [name for name in _REQUIRED_PARAMS if not params.get(name)]
    if missing:
        raise _incomplete("AWS query-string parameters must include "
                          f"{', '.join(repr(n) for n in _REQUIRED_PARAMS)}. Missing: "
                          f"{', '.join(missing)}. Re-examine the query-string parameters.")
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise _incomplete(f"X-Amz-Algorithm must be {ALGORITHM}.")
    signature = params["X-Amz-Signature"]
    if not _SIGNATURE.fullmatch(signature):
        raise _incomplete("X-Amz-Signature must be 64 lower-case hexadecimal digits.")
    account, date, region, service = _scope(params["X-Amz-Credential"])
    stamp = _valid_window(params["X-Amz-Date"], date, params["X-Amz-Expires"], now, skew_s)
    names = tuple(name.lower() for name in params["X-Amz-SignedHeaders"].split(";"))
    required = ["host"] + (["x-amz-target"] if "x-amz-target" in headers else [])
    unsigned = [name for name in required if name not in names]
    if unsigned:
        raise _incomplete(f"X-Amz-SignedHeaders must include {', '.join(unsigned)}")
    keys_now = _keys_of(account, service, keys)
    return Claim(account, date, region, service, stamp, names, signature, keys_now,
                 presigned=True)


def _valid_window(stamp: str, date: str, expires: str, now: float, skew_s: float) -> str:
    """A presigned request's X-Amz-Date, once ``now`` is within its validity: from
    ``skew_s`` before it (a signer's clock ahead of ours) to X-Amz-Expires after it."""
    signed_at = _signed_at(stamp, date, "query parameter")
    expires_s = _expires_s(expires)
    if now < signed_at - skew_s:
        raise _expired(f"Request is not yet valid: X-Amz-Date {stamp} is more than "
                       f"{skew_s / 60:.0f} minutes ahead of the server's time.")
    if now > signed_at + expires_s:
        raise _expired(f"Request has expired: signed at {stamp} for {expires_s} seconds.")
    return stamp


def _expires_s(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_EXPIRES_DIGITS
            and 1 <= int(text) <= MAX_EXPIRES_S):
        raise SqsError("InvalidQueryParameter", f"X-Amz-Expires must be a whole number of "
                       f"seconds from 1 to {MAX_EXPIRES_S} (a week), got {text!r:.40}.")
    return int(text)


def _expired(message: str) -> SqsError:
    return SqsError("RequestExpired", message, status=400)


def verify(request: SignedRequest, keys: Callable[[str], Sequence[str]], now: float,
           skew_s: float = MAX_SKEW_S, payload_hash: str | None = None) -> Caller:
    """The caller of a SigV4-signed request (header-signed or presigned). Raises SqsError
    (as :func:`claim` and :func:`verify_claim` do) otherwise."""
    return verify_claim(request, claim(request.headers, keys, now, skew_s, request.query),
                        payload_hash)


def verify_claim(request: SignedRequest, found: Claim, payload_hash: str | None = None) -> Caller:
    """The caller: the signature recomputed with each key of the claimed account, over
    the body or, before it is read, over the ``payload_hash`` the request signed
    (:func:`signed_payload_hash`; the body is then checked with :func:`check_payload`).
    Raises SqsError (IncompleteSignature, SignatureDoesNotMatch)."""
    if found.presigned:
        return _match(found, presigned_canonical_requests(request, found))
    return _match(found, [canonical_request(request, found.signed_names, payload_hash)])


def signed_payload_hash(headers: Mapping[str, str]) -> str | None:
    """The body's SHA-256 a header-signed request carries in X-Amz-Content-SHA256 (signed
    with it, as every SigV4 header is), or None: with it, the signature is checked before
    a byte of the body is read."""
    claimed = headers.get("x-amz-content-sha256", "")
    return claimed if "authorization" in headers and _SIGNATURE.fullmatch(claimed) else None


def check_payload(body: bytes, payload_hash: str) -> None:
    """Raise SignatureDoesNotMatch unless ``body`` is the one whose hash was signed."""
    if _sha256(body) != payload_hash:
        raise _payload_mismatch()


def _payload_mismatch() -> SqsError:
    return _mismatch("X-Amz-Content-SHA256 does not match the request body")


def presigned_canonical_requests(request: SignedRequest, found: Claim) -> list[str]:
    """The canonical requests a presigned request may have been signed as: its query
    without X-Amz-Signature, and the body's SHA-256 (botocore's SigV4QueryAuth) or, for
    an empty body only, UNSIGNED-PAYLOAD (the SigV4 query-parameter form): a body that
    carries parameters must be signed."""
    query = "&".join(pair for pair in request.query.split("&")
                     if not pair.startswith("X-Amz-Signature="))
    unsigned = replace(request, query=query)
    hashes = [_sha256(request.body)] + ([] if request.body else [UNSIGNED_PAYLOAD])
    return [canonical_request(unsigned, found.signed_names, h) for h in hashes]


def _match(found: Claim, canonicals: Sequence[str]) -> Caller:
    """The caller whose key signed one of ``canonicals``; raises SignatureDoesNotMatch."""
    scope = f"{found.date}/{found.region}/{found.service}/aws4_request"
    to_sign = [("\n".join([ALGORITHM, found.stamp, scope, _sha256(c)])).encode()
               for c in canonicals]
    for key in found.keys:
        signing = signing_key(key, found.date, found.region, found.service)
        for message in to_sign:
            mine = hmac.new(signing, message, hashlib.sha256).hexdigest()
            if hmac.compare_digest(mine, found.signature):
                return Caller(found.account, key, found.region)
    raise _mismatch("The request signature we calculated does not match the signature you "
                    "provided. Check your AWS Secret Access Key and signing method.")


def _scope(credential: str) -> tuple[str, str, str, str]:
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]) \
            or not valid_region(parts[2]):  # the region names the queues' namespace
        raise _incomplete(f"Credential must have the form "
                          f"ACCOUNT/YYYYMMDD/REGION/{SERVICE}/aws4_request, got {credential!r}")
    return parts[0], parts[1], parts[2], parts[3]


def _timestamp(stamp: str, date: str, now: float, skew_s: float) -> str:
    """The X-Amz-Date of a request, checked against the scope's date and the clock."""
    if abs(_signed_at(stamp, date) - now) > skew_s:
        raise _mismatch(f"Signature expired: {stamp} is more than {skew_s / 60:.0f} minutes "
                        "away from the server's time.")
    return stamp


def _signed_at(stamp: str, date: str, where: str = "header") -> float:
    """When an X-Amz-Date says the request was signed (s since the epoch); its day must be
    the credential scope's."""
    try:
        signed_at = _parsed_stamp(stamp)
    except ValueError:
        raise _missing(f"Request is missing a valid X-Amz-Date {where} "
                       "(YYYYMMDDTHHMMSSZ)") from None
    if stamp[:8] != date:
        raise _mismatch(f"Date in Credential scope does not match YYYYMMDD from X-Amz-Date: "
                        f"{date} != {stamp[:8]}")
    return signed_at.timestamp()


@functools.lru_cache(maxsize=256)  # an SDK's requests of one second share their stamp
def _parsed_stamp(stamp: str) -> datetime:
    """An X-Amz-Date (YYYYMMDDTHHMMSSZ) as a UTC datetime; raises ValueError. Sliced by
    hand: ``strptime`` costs more than the rest of the header checks together."""
    if len(stamp) != 16 or stamp[8] != "T" or stamp[15] != "Z" \
            or not (stamp[:8] + stamp[9:15]).isdigit() or not stamp.isascii():
        raise ValueError(stamp)
    return datetime(int(stamp[:4]), int(stamp[4:6]), int(stamp[6:8]), int(stamp[9:11]),
                    int(stamp[11:13]), int(stamp[13:15]), tzinfo=timezone.utc)


def canonical_request(request: SignedRequest, signed_names: Sequence[str],
                      payload_hash: str | None = None) -> str:
    """The canonical request of SigV4 over the headers named in ``signed_names``;
    ``payload_hash`` stands for the body (default: its SHA-256, checked against
    X-Amz-Content-SHA256)."""
    names = sorted(name.lower() for name in signed_names)
    headers = []
    for name in names:
        if name not in request.headers:
            raise _incomplete(f"Header {name!r} is signed but missing from the request")
        headers.append(f"{name}:{' '.join(request.headers[name].split())}\n")
    body_hash = payload_hash
    if body_hash is None:
        body_hash = _sha256(request.body)
        claimed = request.headers.get("x-amz-content-sha256")
        if claimed is not None and claimed != body_hash:
            raise _payload_mismatch()
    return "\n".join([request.method.upper(), _canonical_path(request.path),
                      _canonical_query(request.query), "".join(headers), ";".join(names),
                      body_hash])


def _canonical_path(path: str) -> str:
    normal = posixpath.normpath(path) if path not in ("", "/") else "/"
    if path.endswith("/") and normal != "/":
        normal += "/"
    return quote(normal.replace("//", "/"), safe="/~")


def _canonical_query(query: str) -> str:
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&") if pair)
    return "&".join(f"{key}={value}" for key, value in pairs)


@functools.lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """SigV4's derived key of a secret for one day, region and service: four HMACs,
    computed once per (key, day, region, service) and then kept (a few per account)."""
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
