"""Numeric answers: pull the answer out of a completion and compare it exactly.

Rewards must be pure functions that every verifier recomputes bit for bit, so values are
compared as :class:`fractions.Fraction` (never floats) and the accepted syntax is a small
explicit grammar rather than a heuristic:

* ``[$] [+|-|−] [$] number [%] [.]`` where *number* is an integer with optional valid
  thousands groups (``1,234,567`` yes, ``1,2`` no) and optional decimals (``3.50``, ``.5``),
  a fraction ``3/4``, a LaTeX ``\\frac{3}{4}`` / ``\\dfrac`` / ``\\tfrac``, or a mixed number
  ``1 1/2`` / ``1\\frac{1}{2}``.
* ``$`` and ``%`` are dropped without changing the value: GSM8K writes units like
  ``#### $5`` or ``50%`` with the number meaning the same thing either way.
* One trailing period is a sentence end (``42.``).
* The whole answer may be wrapped in ``\\boxed{...}`` and/or math delimiters ``$...$``,
  ``\\(...\\)``, ``\\[...\\]`` (at most four wrappers in all); only inside ``\\boxed{}``
  is a trailing ``\\text{unit}`` ignored, since that is where LaTeX answers put units.
* Scientific notation (``1e3``) is rejected: GSM8K/MATH answers never use it, and a huge
  exponent would make an exact Fraction arbitrarily expensive for every verifier. For the
  same reason numbers past Python's 4300-digit int-parsing limit are not numbers.

Reference answers are stored as :func:`canonical_number` text. GSM8K solutions end with a
line ``#### <number>``; :func:`extract_answer` understands that convention too.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from fractions import Fraction

_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER = re.compile(
    rf"""(?:\\?\$\s*)?(?P<sign>[+-]?)\s*(?:\\?\$\s*)?
    (?: (?:(?P<whole>\d+)\s+)? (?P<num>\d+)\s*/\s*(?P<den>\d+)   # 3/4, 1 1/2
      | (?P<decimal>{_DECIMAL}) )                                # 1,234.50
    \s*(?:\\?%)?\s*\.?""",
    re.VERBOSE | re.ASCII,
)
# \frac{a}{b} becomes " a/b" so "1\frac{1}{2}" reads as the mixed number "1 1/2".
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}", re.ASCII)
_DELIMITED = re.compile(r"\$(.*)\$|\\\((.*)\\\)|\\\[(.*)\\\]", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"[{}]")
_MAX_WRAPPERS = 4
_TEXT_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}\s*$")
_HASHES = re.compile(r"^[ \t]*####(.*)$", re.MULTILINE)
# A minus glued to a preceding word or digit is a hyphen or range ("pages 3-4"), not a sign.
_NUMBER_TOKEN = re.compile(r"(?:(?<![\w)])-)?[\d,]*\.?\d+(?:/\d+)?", re.ASCII)


def _normalize(text: str) -> str:
    # NFKC folds full-width digits and signs; U+2212 (math minus) has no NFKC mapping.
    return " ".join(unicodedata.normalize("NFKC", text).replace("\u2212", "-").split())


def _boxed(text: str) -> list[tuple[int, int, int]]:
    """Every ``\\boxed{...}`` as (start, content start, end) in order of start, nesting allowed.

    One pass over the braces with a stack, and no slicing, so a completion stuffed with
    ``\\boxed{`` costs every verifier linear, not quadratic, time.
    """
    opens = {match.end(): match.start() for match in _BOXED.finditer(text)}
    found, stack = [], []
    for brace in _BRACE.finditer(text):
        if brace[0] == "{":
            stack.append(brace.end())
        elif stack and (content := stack.pop()) in opens:
            found.append((opens[content], content, brace.end()))
    return sorted(found)


#: Answers up to this many characters are memoised: a group's samples and its reference repeat
#: the same short strings, and an adversarial long completion must not fill the cache.
_MEMO_CHARS = 256


def parse_number(text: str) -> Fraction | None:
    """The exact value of a one-number answer string, or None if it is not exactly one."""
    return _parse_memoised(text) if len(text) <= _MEMO_CHARS else _parse(text)


def _parse(text: str) -> Fraction | None:
    text = _normalize(text)
    # Peel wrappers ($...$, \(...\), \[...\], \boxed{...}); a few suffice for any honest
    # answer, and a bound keeps deeply nested adversarial input cheap.
    for _ in range(_MAX_WRAPPERS):
        if delimited := _DELIMITED.fullmatch(text):
            text = next(group for group in delimited.groups() if group is not None).strip()
        elif (boxes := _boxed(text)) and boxes[0][0] == 0 and boxes[0][2] == len(text):
            text = _TEXT_UNIT.sub("", text[boxes[0][1]:-1]).strip()
        else:
            break
    match = _NUMBER.fullmatch(_LATEX_FRAC.sub(r" \1/\2", text).strip())
    if match is None:
        return None
    try:
        if match["decimal"] is not None:
            value = Fraction(match["decimal"].replace(",", ""))
        elif int(match["den"]) == 0:
            return None
        else:
            value = int(match["whole"] or 0) + Fraction(int(match["num"]), int(match["den"]))
    except ValueError:  # past the int-parsing digit limit
        return None
    return -value if match["sign"] == "-" else value


_parse_memoised = functools.lru_cache(maxsize=1 << 14)(_parse)


def canonical_number(value: Fraction | int) -> str:
    """Stored form of a reference answer: ``42``, ``-7``, ``3/4``, ``-7/2`` (reduced)."""
    return str(Fraction(value))


def extract_answer(completion: str, tag: str | None = "answer") -> str | None:
    """The answer a completion gives, as text (not yet parsed).

    With a ``tag``, only the content of the last ``<tag>...</tag>`` pair counts: the policy
    was asked for that format, and the last pair is its final word. Without one (None or
    ``""``), fall back to conventions of untagged solutions: the last ``\\boxed{}``, else
    the last GSM8K ``#### `` line, else the last number-looking token.
    """
    if tag:  # "" means no tag too, as in a reward spec's default
        end = completion.rfind(f"</{tag}>")
        start = completion.rfind(f"<{tag}>", 0, max(end, 0))
        if end < 0 or start < 0:
            return None
        return completion[start + len(tag) + 2:end].strip()
    if (boxed := last_boxed(completion)) is not None:
        return boxed
    if hashes := _HASHES.findall(completion):
        last: str = hashes[-1]  # one group, so findall gives its text
        return last.strip()
    tokens = _NUMBER_TOKEN.findall(_normalize(completion))
    return tokens[-1] if tokens else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), stripped; None without one.
    A completion's answer (:func:`extract_answer`), and a MATH solution's reference."""
    if boxes := _boxed(text):
        _, content, end = boxes[-1]
        return text[content:end - 1].strip()
    return None


def answers_match(given: str | None, reference: str) -> bool:
    """Same number; a non-numeric reference falls back to normalized exact text."""
    if given is None:
        return False
    expected = parse_number(reference)
    if expected is None:
        return _normalize(given) == _normalize(reference)
    return parse_number(given) == expected


def answer_form(text: str) -> bytes:
    """The normalized form that :func:`answers_match` compares, as bytes: two answers match
    exactly when their forms are equal (for a reference, as for a given answer). A number is
    ``n:`` and its :func:`canonical_number`; anything else ``t:`` and its normalized text.
    What a zk proof of a private answer's match compares (proofs/circuits.py, specs/zk.md §3):
    the verifier recomputes the given answer's form from the public completion."""
    value = parse_number(text)
    if value is None:
        return f"t:{_normalize(text)}".encode()
    try:
        return f"n:{canonical_number(value)}".encode()
    except ValueError:  # past Python's int-to-decimal digit limit: hex has none, and is as exact
        return f"n:x{value.numerator:x}/{value.denominator:x}".encode()


#: A reference answer kept private, published as its salted commitment (specs/zk.md §7):
#: ``zk:`` and the 64 hex digits of the commitment.
COMMITTED_PREFIX = "zk:"


def committed_reference(reference: str) -> bytes | None:
    """The commitment a committed reference names, None for an ordinary reference; a
    reference that starts with COMMITTED_PREFIX but names no commitment is a ValueError."""
    if not reference.startswith(COMMITTED_PREFIX):
        if _normalize(reference).lower().startswith(COMMITTED_PREFIX):  # "ZK:..", " zk:..": never plain text
            raise ValueError(f"a committed reference is {COMMITTED_PREFIX} and 64 lowercase hex digits, "
                             f"got {reference[:80]!r}")
        return None
    digits = reference[len(COMMITTED_PREFIX):]
    if len(digits) != 64 or digits.strip("0123456789abcdef"):
        raise ValueError(f"a committed reference is {COMMITTED_PREFIX} and 64 lowercase hex digits, "
                         f"got {reference[:80]!r}")
    return bytes.fromhex(digits)


def has_format(completion: str, tag: str) -> bool:
    """The format reward: one ``<tag>number</tag>`` pair, and nothing but whitespace after it."""
    open_, close = f"<{tag}>", f"</{tag}>"
    if not tag or completion.count(open_) != 1 or completion.count(close) != 1:
        return False
    start, end = completion.find(open_), completion.find(close)
    return (start < end and not completion[end + len(close):].strip()
            and parse_number(completion[start + len(open_):end]) is not None)
