"""ECVRF-EDWARDS25519-SHA512-TAI, the verifiable random function of RFC 9381 (specs/vrf.md).

Suite ``0x03`` of RFC 9381 section 5.5: edwards25519 with SHA-512, try-and-increment hash to
curve (section 5.4.1.1), RFC 8032-style nonces (section 5.4.2.2), ``cLen = 16``,
``encode_to_curve_salt = PK_string``, and the key check ``ECVRF_validate_key`` (section 5.4.5)
always run by :func:`verify`. The key is an RFC 8032 Ed25519 key (section 5.1.5 of RFC 8032):
a node's signing key is its VRF key, and its node id is its VRF public key.

The API (specs/vrf.md): :func:`public_key`, :func:`prove`, :func:`proof_to_hash`,
:func:`verify`; every one of them checks its inputs (types, lengths, canonical encodings,
points on the curve, ``s < q``) and raises only :class:`VrfError`.

Checked against the three ECVRF-EDWARDS25519-SHA512-TAI examples of RFC 9381 appendix B.3
(tests/test_vrf.py, specs/vectors/vrf.json), including their intermediate ``H`` and ``k``.

Point and scalar arithmetic is libsodium's (through PyNaCl's ``nacl.bindings``):

* constant time: ``x*B`` and ``k*B`` (``crypto_scalarmult_ed25519_base_noclamp``), ``x*H`` and
  ``k*H`` (``crypto_scalarmult_ed25519_noclamp``), ``k + c*x mod q`` and every reduction mod
  ``q`` (``crypto_core_ed25519_scalar_*``). These are all the operations on the secret scalar
  ``x`` and the nonce ``k``. No Python integer ever holds ``x`` or ``k``.
* not constant time, on public data only: decoding and validating points (a Python comparison
  for the canonical encoding, libsodium for curve membership), the try-and-increment loop (its
  iteration count depends on the public ``PK || alpha``), cofactor clearing, the challenge, and
  everything in :func:`verify` and :func:`proof_to_hash`.
* not done: Python ``bytes`` holding the secret (the seed, the SHA-512 expansion, the clamped
  scalar) are not zeroized after use, and their copying and slicing is CPython's, which does not
  promise constant time (it does not branch on the values).

libsodium's variable-base multiplication refuses points outside the prime-order subgroup, and
its results refuse the identity. The RFC accepts such points where a proof or a public key
carries them (``Gamma`` and ``Y`` are only required to decode and ``Y`` not to have small
order), so :func:`_mul` splits such a point into its prime-order and torsion parts and
multiplies each; honest inputs never take that path.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from nacl import bindings as _na
from nacl import exceptions as _nacl_exceptions

from proofs.errors import ProofsError

__all__ = ["OUTPUT_BYTES", "PROOF_BYTES", "VrfError", "proof_to_hash", "prove", "public_key", "verify"]

#: RFC 9381 section 5.5: suite_string for ECVRF-EDWARDS25519-SHA512-TAI.
SUITE = b"\x03"
#: RFC 9381 section 5.5: ptLen = fLen = qLen = 32 (RFC 8032 encodings), cLen = 16.
POINT_BYTES = 32
SCALAR_BYTES = 32
CHALLENGE_BYTES = 16
#: pi = point_to_string(Gamma) || int_to_string(c, cLen) || int_to_string(s, qLen) (section 5.1 step 8).
PROOF_BYTES = POINT_BYTES + CHALLENGE_BYTES + SCALAR_BYTES  # 80
#: beta is a SHA-512 output (section 5.2).
OUTPUT_BYTES = 64
SECRET_BYTES = 32
#: The longest alpha accepted. Not in the RFC: the protocol's inputs are 57 bytes (specs/vrf.md
#: section 4), and a bound keeps a hostile caller from making verify hash megabytes.
MAX_ALPHA_BYTES = 1024

#: Domain separators of RFC 9381: 0x01/0x00 around encode_to_curve (5.4.1.1), 0x02/0x00 around
#: the challenge (5.4.3), 0x03/0x00 around proof_to_hash (5.2).
_ENCODE_FRONT, _CHALLENGE_FRONT, _HASH_FRONT, _BACK = b"\x01", b"\x02", b"\x03", b"\x00"

#: edwards25519 (RFC 8032 section 5.1): the field prime p and the prime group order q (RFC 9381's q, RFC 8032's L).
_P = 2**255 - 19
_Q = 2**252 + 27742317777372353535851937790883648493
#: 8^-1 mod q: multiplying 8*P by it gives P's prime-order component.
_INV8 = pow(8, -1, _Q).to_bytes(32, "little")
#: point_to_string of the identity (x = 0, y = 1).
_IDENTITY = b"\x01" + bytes(31)
#: point_to_string of the eight points of small order (the torsion subgroup): the identity, the
#: point of order 2 (y = -1), two of order 4 (y = 0) and four of order 8. tests/test_vrf.py
#: derives the set from the curve equation and compares.
_SMALL_ORDER = frozenset(bytes.fromhex(encoded) for encoded in (
    "0100000000000000000000000000000000000000000000000000000000000000",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
))


class VrfError(ProofsError, ValueError):
    """An input that the VRF cannot accept: a malformed key, proof or alpha, or a proof that
    does not verify. The only exception this module raises."""


# -- encodings (RFC 8032 section 5.1.2, 5.1.3; RFC 9381 section 5.5) ---------------------------


def _as_bytes(value: object, name: str, length: int | None = None) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise VrfError(f"{name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if length is not None and len(data) != length:
        raise VrfError(f"{name} must be {length} bytes, got {len(data)}")
    return data


def _alpha(alpha: object) -> bytes:
    data = _as_bytes(alpha, "alpha")
    if len(data) > MAX_ALPHA_BYTES:
        raise VrfError(f"alpha is {len(data)} bytes, more than the {MAX_ALPHA_BYTES} accepted")
    return data


def _nacl(function: Callable[..., bytes], *args: bytes) -> bytes:
    """Call a libsodium binding; its refusal (a point it does not accept, an identity result)
    becomes a VrfError."""
    try:
        return function(*args)
    except (_nacl_exceptions.CryptoError, ValueError, TypeError) as error:
        raise VrfError(f"edwards25519 operation refused: {error}") from None


def _decodes(encoded: bytes) -> bool:
    """Whether ``encoded`` is a point per RFC 8032 section 5.1.3: y < p (step 1), x exists
    (step 3), and not x = 0 with the sign bit set (step 4). So only canonical encodings pass,
    and ``encoded == point_to_string(string_to_point(encoded))``."""
    y = int.from_bytes(encoded, "little") & ((1 << 255) - 1)
    if y >= _P:
        return False
    if y in (1, _P - 1) and encoded[31] & 0x80:  # x = 0 exactly when y^2 = 1; -0 is not canonical
        return False
    # libsodium's addition decodes any point on the curve (after the checks above, exactly as
    # RFC 8032 does) and fails where step 3 finds no square root.
    try:
        _na.crypto_core_ed25519_add(encoded, _IDENTITY)
    except _nacl_exceptions.CryptoError:
        return False
    return True


def _string_to_point(encoded: bytes, name: str) -> bytes:
    if not _decodes(encoded):
        raise VrfError(f"{name} is not the RFC 8032 encoding of an edwards25519 point")
    return encoded


def _times8(point: bytes) -> bytes:
    """cofactor * point, for any point on the curve (three doublings by libsodium's addition,
    which, unlike its multiplication, accepts points outside the prime-order subgroup)."""
    for _ in range(3):
        point = _nacl(_na.crypto_core_ed25519_add, point, point)
    return point


def _scalar(value: int) -> bytes:
    return value.to_bytes(SCALAR_BYTES, "little")


def _mul(scalar: int, point: bytes) -> bytes:
    """scalar * point for a public scalar (0 <= scalar < 2^256) and any point on the curve.

    libsodium multiplies points of the prime-order subgroup (not the identity) by scalars that
    are nonzero mod q, and refuses the rest. A point P outside the subgroup (with a torsion part
    T, of order dividing 8) is split: P' = 8^-1 * (8 * P) is its prime-order part, T = P - P',
    and scalar * P = scalar * P' + (scalar mod 8) * T."""
    reduced = scalar % _Q
    if reduced:
        try:
            return _na.crypto_scalarmult_ed25519_noclamp(_scalar(reduced), point)
        except _nacl_exceptions.CryptoError:
            pass  # not of prime order: split it below
    elif _na.crypto_core_ed25519_is_valid_point(point):
        return _IDENTITY  # q * P' = identity
    if point == _IDENTITY:
        return _IDENTITY
    prime = _prime_part(_times8(point))
    torsion = _nacl(_na.crypto_core_ed25519_sub, point, prime)
    result = _IDENTITY if prime == _IDENTITY or not reduced else _nacl(
        _na.crypto_scalarmult_ed25519_noclamp, _scalar(reduced), prime)
    for _ in range(scalar % 8):
        result = _nacl(_na.crypto_core_ed25519_add, result, torsion)
    return result


def _prime_part(eight: bytes) -> bytes:
    """P' = 8^-1 * (8 * P), given 8 * P (in the prime-order subgroup, possibly the identity)."""
    if eight == _IDENTITY:
        return _IDENTITY
    return _nacl(_na.crypto_scalarmult_ed25519_noclamp, _INV8, eight)


def _base_mul(scalar: bytes) -> bytes:
    """scalar * B for a scalar < q in 32 little-endian bytes (constant time in libsodium);
    the zero scalar gives the identity, which libsodium refuses to return. The scalar may be
    secret (x, k), so it is compared with zero in constant time."""
    if hmac.compare_digest(scalar, bytes(SCALAR_BYTES)):
        return _IDENTITY
    return _nacl(_na.crypto_scalarmult_ed25519_base_noclamp, scalar)


# -- RFC 9381 section 5.4 auxiliary functions --------------------------------------------------


def _encode_to_curve(salt: bytes, alpha: bytes) -> bytes:
    """ECVRF_encode_to_curve_try_and_increment (RFC 9381 section 5.4.1.1), salt = PK_string.

    hash_string = SHA-512(suite || 0x01 || salt || alpha || ctr || 0x00) for ctr = 0, 1, ...;
    its first 32 bytes are decoded as a point (interpret_hash_value_as_a_point, section 5.5),
    multiplied by the cofactor 8; the first result that decodes and is not the identity is H.
    The loop's length depends only on public data (PK and alpha)."""
    for ctr in range(256):  # ctr_string = int_to_string(ctr, 1): at most 256 tries (about 2^-256 to run out)
        candidate = hashlib.sha512(SUITE + _ENCODE_FRONT + salt + alpha + bytes([ctr]) + _BACK).digest()[:POINT_BYTES]
        if _decodes(candidate):
            point = _times8(candidate)
            if point != _IDENTITY:
                return point
    raise VrfError("encode_to_curve found no point in 256 tries")  # probability about 2^-256


def _challenge(*points: bytes) -> bytes:
    """ECVRF_challenge_generation (RFC 9381 section 5.4.3) over (Y, H, Gamma, U, V): the first
    cLen = 16 bytes of SHA-512(suite || 0x02 || points || 0x00), read little-endian as c."""
    return hashlib.sha512(SUITE + _CHALLENGE_FRONT + b"".join(points) + _BACK).digest()[:CHALLENGE_BYTES]


def _decode_proof(pi: object) -> tuple[bytes, bytes, int]:
    """ECVRF_decode_proof (RFC 9381 section 5.4.4): Gamma must decode, s must be < q."""
    data = _as_bytes(pi, "pi", PROOF_BYTES)
    gamma = _string_to_point(data[:POINT_BYTES], "pi's Gamma")
    c_string = data[POINT_BYTES:POINT_BYTES + CHALLENGE_BYTES]
    s = int.from_bytes(data[POINT_BYTES + CHALLENGE_BYTES:], "little")
    if s >= _Q:
        raise VrfError("pi's s is not less than the group order q (a non-canonical scalar)")
    return gamma, c_string, s


def _expand(secret: object) -> tuple[bytes, bytes, bytes]:
    """RFC 8032 section 5.1.5 (RFC 9381 section 5.5): SHA-512 of the 32-byte secret; its first
    half clamped is the scalar x (returned reduced mod q, 32 bytes), its second half the nonce
    prefix (section 5.4.2.2 step 2); Y = x*B. Returns (x, prefix, PK_string)."""
    seed = _as_bytes(secret, "secret", SECRET_BYTES)
    digest = hashlib.sha512(seed).digest()
    clamped = bytearray(digest[:32])
    clamped[0] &= 248
    clamped[31] &= 127
    clamped[31] |= 64
    x = _na.crypto_core_ed25519_scalar_reduce(bytes(clamped) + bytes(32))
    return x, digest[32:], _base_mul(x)


# -- the API ------------------------------------------------------------------------------------


def public_key(secret: bytes) -> bytes:
    """The 32-byte public key of an RFC 8032 32-byte secret key: point_to_string(x*B)."""
    return _expand(secret)[2]


def prove(secret: bytes, alpha: bytes) -> bytes:
    """ECVRF_prove (RFC 9381 section 5.1): the 80-byte proof pi of ``alpha`` under ``secret``."""
    x, prefix, y = _expand(secret)  # step 1
    message = _alpha(alpha)
    h = _encode_to_curve(y, message)  # steps 2, 3: encode_to_curve_salt = PK_string
    gamma = _nacl(_na.crypto_scalarmult_ed25519_noclamp, x, h)  # step 4
    # Step 5, ECVRF_nonce_generation_RFC8032 (section 5.4.2.2): k = SHA-512(prefix || h_string) mod q.
    k = _na.crypto_core_ed25519_scalar_reduce(hashlib.sha512(prefix + h).digest())
    c_string = _challenge(y, h, gamma, _base_mul(k), _nacl(_na.crypto_scalarmult_ed25519_noclamp, k, h))  # step 6
    c = c_string + bytes(SCALAR_BYTES - CHALLENGE_BYTES)
    s = _na.crypto_core_ed25519_scalar_add(k, _na.crypto_core_ed25519_scalar_mul(c, x))  # step 7: (k + c*x) mod q
    return gamma + c_string + s  # step 8


def proof_to_hash(pi: bytes) -> bytes:
    """ECVRF_proof_to_hash (RFC 9381 section 5.2): beta = SHA-512(suite || 0x03 ||
    point_to_string(8 * Gamma) || 0x00). It does not verify pi; VrfError if pi does not decode."""
    gamma = _decode_proof(pi)[0]
    return hashlib.sha512(SUITE + _HASH_FRONT + _times8(gamma) + _BACK).digest()


def verify(public: bytes, pi: bytes, alpha: bytes) -> bytes:
    """ECVRF_verify (RFC 9381 section 5.3) with validate_key: beta if pi proves alpha under
    ``public``, else VrfError naming why."""
    y = _string_to_point(_as_bytes(public, "public key", POINT_BYTES), "public key")  # steps 1, 2
    # Step 3, ECVRF_validate_key (section 5.4.5): cofactor * Y is the identity exactly for the
    # eight points of small order, and each has one encoding that decodes.
    if y in _SMALL_ORDER:
        raise VrfError("public key has small order (cofactor * Y is the identity)")
    gamma, c_string, s = _decode_proof(pi)  # steps 4 to 6
    message = _alpha(alpha)
    h = _encode_to_curve(y, message)  # step 7
    c = int.from_bytes(c_string, "little")
    u = _nacl(_na.crypto_core_ed25519_sub, _base_mul(_scalar(s)), _mul(c, y))  # step 8: U = s*B - c*Y
    v = _nacl(_na.crypto_core_ed25519_sub, _mul(s, h), _mul(c, gamma))  # step 9: V = s*H - c*Gamma
    if _challenge(y, h, gamma, u, v) != c_string:  # steps 10, 11 (c and c' are public)
        raise VrfError("pi does not prove alpha under this public key")
    return hashlib.sha512(SUITE + _HASH_FRONT + _times8(gamma) + _BACK).digest()
