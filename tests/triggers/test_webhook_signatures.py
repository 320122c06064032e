"""The signature matrix (SPEC 9.2 step 3) on the verifier itself: each
envelope valid, tampered, stale and missing; plus the path subset of the
payload mapping. The same refusals over HTTP are in test_webhooks.py."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from apps.triggers.webhooks.mapping import lookup, parse_path
from apps.triggers.webhooks.signatures import Check, check_bearer, check_hmac

SECRET = b"s3cret"
BODY = b'{"action":"opened"}'


def mac(message: bytes, secret: bytes = SECRET) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def github(body: bytes = BODY) -> str:
    return "sha256=" + mac(body)


def bare(body: bytes = BODY) -> str:
    return mac(body)


def stripe(body: bytes = BODY, at: int | None = None) -> str:
    t = int(time.time()) if at is None else at
    return f"t={t},v1={mac(str(t).encode() + b'.' + body)}"


ENVELOPES = {"github": github, "bare": bare, "stripe": stripe}
FORMATS = {"github": "github", "bare": "hex", "stripe": "stripe"}  # the definition's auth.format per envelope


@pytest.mark.parametrize("envelope", sorted(ENVELOPES))
def test_a_valid_signature_of_each_envelope_is_accepted(envelope: str) -> None:
    assert check_hmac(SECRET, BODY, ENVELOPES[envelope](), fmt=FORMATS[envelope]) is Check.OK


@pytest.mark.parametrize("envelope", sorted(ENVELOPES))
def test_a_tampered_body_fails_each_envelope(envelope: str) -> None:
    assert check_hmac(SECRET, BODY + b" ", ENVELOPES[envelope](), fmt=FORMATS[envelope]) is Check.MISMATCH


@pytest.mark.parametrize("envelope", sorted(ENVELOPES))
def test_a_signature_with_another_secret_fails_each_envelope(envelope: str) -> None:
    assert check_hmac(b"other", BODY, ENVELOPES[envelope](), fmt=FORMATS[envelope]) is Check.MISMATCH


@pytest.mark.parametrize("value", [None, "", "   "])
def test_a_missing_signature_is_refused(value: str | None) -> None:
    assert check_hmac(SECRET, BODY, value) is Check.MISSING


@pytest.mark.parametrize("skew", [-301, 301, -3600])
def test_a_stripe_timestamp_outside_five_minutes_is_stale(skew: int) -> None:
    now = time.time()
    assert check_hmac(SECRET, BODY, stripe(at=int(now) + skew), now=now, fmt="stripe") is Check.STALE


@pytest.mark.parametrize("skew", [-299, 0, 299])
def test_a_stripe_timestamp_inside_five_minutes_is_fresh(skew: int) -> None:
    now = time.time()
    assert check_hmac(SECRET, BODY, stripe(at=int(now) + skew), now=now, fmt="stripe") is Check.OK


def test_a_stripe_signature_over_another_timestamp_fails() -> None:
    t = int(time.time())
    forged = f"t={t},v1={mac(str(t - 1).encode() + b'.' + BODY)}"
    assert check_hmac(SECRET, BODY, forged, fmt="stripe") is Check.MISMATCH


def test_a_stripe_header_with_one_good_v1_among_several_passes() -> None:
    t = int(time.time())
    value = f"t={t},v1={'0' * 64},v1={mac(str(t).encode() + b'.' + BODY)}"
    assert check_hmac(SECRET, BODY, value, fmt="stripe") is Check.OK


@pytest.mark.parametrize("value", ["t=abc,v1=00", "t=1,t=2,v1=00", "t=\u00b2,v1=00", "t=" + "9" * 5000 + ",v1=00"])
def test_a_malformed_stripe_header_is_refused(value: str) -> None:
    assert check_hmac(SECRET, BODY, value, fmt="stripe") is Check.MALFORMED


@pytest.mark.parametrize("fmt", [None, "github", "hex"])
def test_an_old_stripe_delivery_resent_as_a_body_mac_is_refused(fmt: str | None) -> None:
    """A Stripe v1 is a MAC over `<t>.` + body: re-sent as body `<t>.<body>`
    with `sha256=<v1>` (or bare) it must not pass a body-MAC check of a
    Stripe webhook, nor can a body-MAC webhook be fed a Stripe header."""
    old = int(time.time()) - 86_400
    v1 = mac(str(old).encode() + b"." + BODY)
    resent = str(old).encode() + b"." + BODY
    assert check_hmac(SECRET, resent, "sha256=" + v1, fmt="stripe") is not Check.OK
    assert check_hmac(SECRET, resent, v1, fmt="stripe") is not Check.OK
    assert check_hmac(SECRET, BODY, stripe(), fmt=fmt) is Check.MALFORMED


def test_a_format_accepts_only_its_own_envelope() -> None:
    assert check_hmac(SECRET, BODY, bare(), fmt="github") is Check.MALFORMED
    assert check_hmac(SECRET, BODY, github(), fmt="hex") is Check.MALFORMED
    assert check_hmac(SECRET, BODY, github(), fmt=None) is Check.OK
    assert check_hmac(SECRET, BODY, bare(), fmt=None) is Check.OK


def test_uppercase_hex_is_accepted() -> None:
    assert check_hmac(SECRET, BODY, "sha256=" + mac(BODY).upper()) is Check.OK


@pytest.mark.parametrize(
    ("value", "scheme", "expected"),
    [
        ("Bearer tok", True, Check.OK),
        ("Bearer tok2", True, Check.MISMATCH),
        ("tok", True, Check.MISMATCH),
        (None, True, Check.MISSING),
        ("tok", False, Check.OK),
        ("Bearer tok", False, Check.MISMATCH),
    ],
)
def test_bearer_matrix(value: str | None, scheme: bool, expected: Check) -> None:
    assert check_bearer("tok", value, scheme=scheme) is expected


@pytest.mark.parametrize(
    ("path", "steps"),
    [("$", []), ("$.a", ["a"]), ("$.a.b[0]", ["a", "b", 0]), ("$[2].x-y", [2, "x-y"])],
)
def test_paths_of_the_subset_parse(path: str, steps: list[str | int]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize("path", ["$..a", "$.*", "$.a[?(@.b)]", "a.b", "$.a[-1]", "$['a']"])
def test_paths_outside_the_subset_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"unsupported|does not start"):
        parse_path(path)


def test_lookup_follows_keys_and_indexes() -> None:
    doc = {"a": {"b": [{"c": 1}, {"c": 2}]}}
    assert lookup(doc, parse_path("$.a.b[1].c")) == 2
    assert lookup(doc, []) == doc
