"""The specs and the code agree (issue 14 §6): what specs/*.md state in their tables is read
from the tables and compared with the code.

specs/vectors/*.json pin the bytes (tests/test_vectors.py); this file pins the rest of what a
second implementation would copy from the specs: reason codes and their stages, outcomes,
domain tags, versions, bounds, tolerance profiles, record and message fields, parameter
defaults and constants. A table with a Code column names, in each row, a file and a constant
(or a dataclass field, whose default is the value) that the row's Value or Default must equal.
Where the code has a complete list (an enum, a dataclass, the tags it uses), the comparison
goes both ways.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import importlib
import inspect
import json
import math
import re
import textwrap
from pathlib import Path

import msgpack
import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"


# -- reading the specs -----------------------------------------------------------------------


def read(doc: str, heading: str | None = None) -> str:
    """The text of ``specs/<doc>``, or of its section whose heading starts with ``heading``
    (up to the next heading of the same or a higher level)."""
    text = (SPECS / doc).read_text(encoding="utf-8")
    if heading is None:
        return text
    match = re.search(rf"^(#+) {re.escape(heading)}.*$", text, re.MULTILINE)
    assert match, f"specs/{doc} has no heading {heading!r}"
    end = re.compile(rf"^#{{1,{len(match.group(1))}}} ", re.MULTILINE).search(text, match.end())
    return text[match.end() : end.start() if end else len(text)]


def cells(line: str) -> list[str]:
    """The cells of a markdown table row; ``\\|`` is a pipe inside a cell."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every table in ``text``, as rows of {header: cell}."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.fullmatch(r"\|[-| :]+\|", lines[i + 1].strip()) and (
                i == 0 or not lines[i - 1].startswith("|")):
            header, rows = cells(line), []
            for number, row in enumerate(lines[i + 2 :], start=i + 3):
                if not row.startswith("|"):
                    break
                assert row.rstrip().endswith("|") and len(cells(row)) == len(header), \
                    f"line {number} is not a row of {len(header)} cells: {row[:80]!r}"
                rows.append(dict(zip(header, cells(row))))
            found.append(rows)
    return found


def table(doc: str, heading: str | None, first_column: str) -> list[dict[str, str]]:
    """The one table of a section whose first column is headed ``first_column``."""
    matching = [t for t in tables(read(doc, heading)) if t and next(iter(t[0])) == first_column]
    assert len(matching) == 1, f"specs/{doc} {heading}: {len(matching)} tables headed {first_column!r}"
    return matching[0]


def spans(cell: str) -> list[str]:
    """The code spans of a cell, in order."""
    return re.findall(r"`([^`]+)`", cell)


def span(cell: str) -> str:
    """The first code span of a cell, which names the row's key or value."""
    found = spans(cell)
    assert found, f"a cell without a `code span` where one is expected: {cell!r}"
    return found[0]


_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


_ARITHMETIC = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Pow, ast.USub)


def value(text: str):
    """A spec value: a bytes literal, a set ``{a, b}`` of names, a number written as the specs
    write them (``16·2^20``, ``1e-3``, ``-100``, ``256 KiB``), or else the text itself."""
    if text.startswith(("b'", 'b"')):
        return ast.literal_eval(text)
    if text.startswith("{") and text.endswith("}"):
        return frozenset(name.strip() for name in text[1:-1].split(",") if name.strip())
    number, _, unit = text.partition(" ")
    if unit and unit not in _UNITS:
        return text
    try:
        tree = ast.parse(number.replace("·", "*").replace("^", "**"), mode="eval")
    except SyntaxError:
        return text
    nodes = list(ast.walk(tree))
    if not all(isinstance(node, _ARITHMETIC) for node in nodes) or not all(
            type(node.value) in (int, float) for node in nodes if isinstance(node, ast.Constant)):
        return text
    return eval(compile(tree, text, "eval"), {"__builtins__": {}}) * _UNITS.get(unit, 1)  # numbers only, checked above


def code_of(cell: str):
    """What a Code cell names: ``path/to/module.py`` then ``NAME`` or ``Class.field``. A
    dataclass field gives its default."""
    names = spans(cell)
    assert len(names) == 2 and names[0].endswith(".py"), f"a Code cell names a file and a constant: {cell!r}"
    module = importlib.import_module(names[0].removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    target = module
    for part in names[1].split("."):
        fields = {f.name: f for f in dataclasses.fields(target)} if dataclasses.is_dataclass(target) else {}
        if part in fields:
            field = fields[part]
            assert field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING, \
                f"{names[1]} has no default"
            return field.default if field.default is not dataclasses.MISSING else field.default_factory()
        assert hasattr(target, part), f"{names[0]} has no {names[1]}"
        target = getattr(target, part)
    return target


def bytes_literals(source: str) -> set[bytes]:
    return {node.value for node in ast.walk(ast.parse(textwrap.dedent(source)))
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes)}


def same(spec, code) -> bool:
    """Whether the code's value is the spec's: numbers by value (never a bool for a number),
    sets of codes as their strings, a tag a function uses inline as one of its literals."""
    if isinstance(spec, bytes) and callable(code):
        return spec in bytes_literals(inspect.getsource(code))
    if isinstance(spec, frozenset):
        return isinstance(code, set | frozenset) and {str(c) for c in code} == spec
    if isinstance(spec, int | float):
        return isinstance(code, int | float) and not isinstance(code, bool) and code == spec
    if isinstance(spec, str):  # text, or an instant as Python prints it
        return isinstance(code, str | datetime.datetime) and str(code) == spec
    return type(code) is type(spec) and code == spec


def _coded_rows() -> list[tuple[str, str, str, str]]:
    """(document, row name, value cell, code cell) of every table row with a Code cell."""
    rows = []
    for doc in sorted(SPECS.glob("*.md")):
        for found in tables(doc.read_text(encoding="utf-8")):
            for row in found:
                if row.get("Code"):
                    column = "Value" if "Value" in row else "Default" if "Default" in row else next(iter(row))
                    rows.append((doc.name, next(iter(row.values())), row[column], row["Code"]))
    return rows


CODED = _coded_rows()


# -- every table row with a Code column --------------------------------------------------------


@pytest.mark.parametrize(("doc", "name", "stated", "code"), CODED, ids=[f"{d}: {n}" for d, n, _, _ in CODED])
def test_every_value_a_spec_table_gives_is_the_codes(doc, name, stated, code):
    spec = value(span(stated))
    actual = code_of(code)
    assert same(spec, actual), f"specs/{doc}: {name} is {stated}, but {' '.join(spans(code))} is {actual!r}"


def test_the_coded_tables_are_found():
    """The parametrized test above passes vacuously if no table is parsed: count them."""
    by_doc = {doc: sum(1 for d, *_ in CODED if d == doc) for doc in {d for d, *_ in CODED}}
    assert len(CODED) >= 90 and {"README.md", "record.md", "network.md", "reputation.md", "tasks.md",
                                 "commitment.md", "sampler.md"} <= set(by_doc), by_doc


@pytest.mark.parametrize("doc", sorted(path.name for path in SPECS.glob("*.md")))
def test_every_table_row_has_its_headers_cells(doc):
    """A pipe inside a cell splits it on GitHub too, and shifts every later cell of the row."""
    assert tables(read(doc))  # tables() checks each row's width


# -- reason codes, stages, outcomes --------------------------------------------------------------


def spec_reasons() -> dict[str, tuple[int, str]]:
    """Each reason code of specs/verification.md §1 with its stage (number, name): from the
    table's Stage column, or else from the ``**Stage N, `name`**`` paragraph above the table."""
    reasons: dict[str, tuple[int, str]] = {}
    stage = None
    lines = read("verification.md", "1. Stages and reason codes").splitlines()
    for i, line in enumerate(lines):
        if match := re.match(r"\*\*Stage (\d+), `(\w+)`", line):
            stage = int(match.group(1)), match.group(2)
        elif line.startswith(("| Reason", "| Stage")):
            for row in tables("\n".join(lines[i:]))[0]:
                if "Stage" in row:
                    number, name = row["Stage"].split()
                    row_stage = int(number), name.strip("`")
                else:
                    row_stage = stage
                (code,) = spans(row["Reason"])
                assert code not in reasons, f"{code} is listed twice"
                assert row_stage is not None, f"{code} has no stage"
                reasons[code] = row_stage
    return reasons


def test_reason_codes_are_the_verifiers_both_ways():
    from vrl.rollouts.verify import Reason, Stage

    spec = spec_reasons()
    codes = {reason.value for reason in Reason}
    assert set(spec) - codes == set(), "specs/verification.md §1 lists codes the verifier does not have"
    assert codes - set(spec) == set(), "the verifier has codes specs/verification.md §1 does not list"
    for code, (number, name) in spec.items():
        assert Stage[name.upper()] == number, f"specs/verification.md: stage {name} is {number}"
        if hasattr(Reason, "stage"):
            assert Reason(code).stage == Stage[name.upper()], f"{code}: spec stage {name}, code {Reason(code).stage!r}"


def test_the_detection_table_names_reasons_at_their_stages():
    """specs/verification.md §4: each attack's reason is a code of the verifier, emitted at the
    stage the row gives."""
    from vrl.rollouts.verify import Reason

    codes = {reason.value for reason in Reason}
    rows = table("verification.md", "4. Detection table", "Attack")
    for row in rows:
        stages = {name.strip() for name in row["Stage"].split("/")}
        named = [code for code in spans(row["Reason"]) if code in codes]
        assert named and spans(row["Reason"])[0] in codes, f"{row['Attack']}: {row['Reason']} is not a reason code"
        for code in named:
            assert Reason(code).stage.name.lower() in stages, f"{row['Attack']}: {code} is not a {row['Stage']} reason"
    assert len(rows) >= 20


def test_expectations_are_the_verifiers():
    from vrl.rollouts.verify import Expectations

    rows = table("verification.md", "2. What the verifier pins", "Field")
    stated = {span(row["Field"]).split(":")[0] for row in rows}
    assert stated == {field.name for field in dataclasses.fields(Expectations)}


def test_stage_numbers_are_the_verdicts():
    from vrl.rollouts.verify import Stage

    (row,) = [r for r in table("verification.md", "3. Verdict", "Field") if r["Field"] == "`stage`"]
    stated = {name: int(number) for name, number in re.findall(r"`(\w+)`=(\d+)", row["Meaning"])}
    assert stated == {stage.name.lower(): stage.value for stage in Stage}


def test_verdict_outcomes_are_the_nodes_both_ways():
    from vrl.node.messages import Outcome

    (row,) = [r for r in table("network.md", "3.2", "Field") if r["Field"] == "`outcome`"]
    assert set(spans(row["Meaning"])) == {outcome.value for outcome in Outcome}


# -- fields ----------------------------------------------------------------------------------------


def test_record_fields_are_the_encoders_both_ways():
    """specs/record.md §1's keys, and §2's sorted list, against the keys of an encoded record."""
    record = bytes.fromhex(json.loads((SPECS / "vectors" / "record.json").read_text())["record"])
    wire = msgpack.unpackb(record, raw=False)
    keys = {"sampling": set(wire["sampling"]), "reward_spec[]": set(wire["reward_spec"][0])}
    from vrl.rollouts.record import _TOP_LEVEL

    stated: dict[str, set[str]] = {"": set(), "sampling": set(), "reward_spec[]": set()}
    optional = set()
    for row in table("record.md", "1. Record fields", "Key"):
        (key,) = spans(row["Key"])
        parent, _, name = key.rpartition(".")
        stated[parent].add(name)
        if "**Optional.**" in " ".join(row.values()):
            optional.add(name)
    assert stated[""] - optional == set(wire)  # the vector has no optional field
    assert stated[""] == _TOP_LEVEL and optional == {"hidden_hashes"}
    assert stated["sampling"] == keys["sampling"] and stated["reward_spec[]"] == keys["reward_spec[]"]
    section = read("record.md", "2. Canonical encoding and signing")
    top = re.search(r"The sorted top-level keys are:\s*`([^`]+)`", section)
    nested = re.search(r"The sorted `sampling` keys are: `([^`]+)`", section)
    assert top and nested
    assert [k.strip() for k in top.group(1).split(",")] == sorted(wire, key=str.encode)
    assert [k.strip() for k in nested.group(1).split(",")] == sorted(wire["sampling"], key=str.encode)


@pytest.mark.parametrize(("heading", "kind"), [("3.2", "verdict"), ("3.3", "policy_delta")])
def test_message_fields_are_the_encoders_both_ways(heading, kind):
    message = bytes.fromhex(json.loads((SPECS / "vectors" / "network.json").read_text())[kind]["message"])
    stated = {span(row["Field"]) for row in table("network.md", heading, "Field")}
    encoded = msgpack.unpackb(message, raw=False)
    # The vector may be written at an older version its message still reads (vrl.node.wire:
    # oldest): the fields added since are stated, and absent from it.
    from vrl.node import messages, wire

    cls = {"verdict": messages.SignedVerdict, "policy_delta": messages.PolicyAnnouncement}[kind]
    newer = {f.name for f in wire.schema_of(cls).fields if f.since > encoded["v"]}
    assert newer <= stated and stated - newer == set(encoded)


def test_a_policy_without_a_delta_is_written_with_the_version_3_fields():
    """specs/network.md §3.3: the version 3 vector has every field of the table but the three
    that version 4 added and the two of version 5."""
    message = bytes.fromhex(json.loads((SPECS / "vectors" / "network.json").read_text())["policy"]["message"])
    stated = {span(row["Field"]) for row in table("network.md", "3.3", "Field")}
    newer = {"delta", "delta_size", "delta_parent", "batch_file", "batch_size"}
    assert stated - newer == set(msgpack.unpackb(message, raw=False))


# -- message schemas: the specs' field tables against vrl/node/wire.py's declarations ---------------


def number(text: str) -> int | float:
    """A bound as the field tables write it: ``2^64 - 1``, ``65,536 x 66,560``, ``256 KiB``, ``+inf``."""
    text = text.strip().replace(",", "").replace(" x ", "·")
    if text in ("inf", "+inf"):
        return math.inf
    for unit, size in _UNITS.items():
        if text.endswith(" " + unit):
            return number(text.removesuffix(" " + unit)) * size
    tree = ast.parse(text.replace("·", "*").replace("^", "**"), mode="eval")
    assert all(isinstance(node, _ARITHMETIC) for node in ast.walk(tree)), f"not a number: {text!r}"
    return eval(compile(tree, text, "eval"), {"__builtins__": {}})  # arithmetic only, checked above


def number_range(bound: str) -> tuple:
    """``lo .. hi``, ``[lo, hi]``, ``< x``, ``>= lo``: (low, high) inclusive; a bound naming another
    field or value (``<= race_tokens``, ``> after``) is a rule the message checks itself, and leaves
    the field the whole msgpack uint range."""
    if match := re.fullmatch(r"(<=?|>=?) ([a-z_]+)", bound):
        return (0, 2**64 - 1)
    if match := re.fullmatch(r"(.+) \.\. (.+)", bound) or re.fullmatch(r"\[(.+), (.+)\]", bound):
        return number(match.group(1)), number(match.group(2))
    if match := re.fullmatch(r"< (.+)", bound):
        return 0, number(match.group(1)) - 1
    if match := re.fullmatch(r">= (.+)", bound):
        return number(match.group(1)), math.inf
    raise AssertionError(f"not a range: {bound!r}")


def stated_type(cell: str, meaning: str) -> tuple:
    """A field table's type cell as :func:`schema_type` describes a wire type. A choice of text
    (a plain ``str``) lists its values in the meaning."""
    text = cell.split(":")[0].strip()  # "bin 32: the group's digest"
    if text.endswith("or nil at the end"):
        return ("nil or", stated_type(text.split(";")[0], meaning))
    if text.endswith(", or absent"):  # an optional field of a request or response (network.md §6)
        return ("absent or", stated_type(text.removesuffix(", or absent"), meaning))
    patterns = [
        (r"bin (\d+)(?: or (\d+))?", lambda m: ("bin", tuple(sorted(int(g) for g in m.groups() if g)))),
        (r"uint(?:,| in)? `([^`]+)`.*", lambda m: ("uint", *number_range(m.group(1)))),
        (r"float(?:64)?,? `([^`]+)`.*", lambda m: ("float", *number_range(m.group(1)))),
        (r"str, at most (\d+) bytes", lambda m: ("str", int(m.group(1)))),
        (r"str", lambda m: ("choice", frozenset(span.strip('"') for span in spans(meaning)))),
        (r"list of at most (\d+) str of at most (\d+) characters", lambda m: ("strs", int(m[1]), int(m[2]))),
        (r"bool", lambda m: ("bool",)),
        (r"list of at most (\d+) bin, each at most ([^(]+?)(?: \(.*)?", lambda m: ("bins", 0, int(m[1]), number(m[2]))),
        (r"list of at most (\d+) `\[bin 32, float64\]`", lambda m: ("pairs", int(m[1]))),
        (r"list of at most (\d+) bin 32", lambda m: ("hashes", int(m[1]))),
        (r"list of (\d+) uint, the last (\d+) in `([^`]+)`",
         lambda m: ("cursor", int(m[1]), int(m[2]), *number_range(m[3]))),
        (r"bin of `(\d+) \+ (\d+) k` bytes, `k` in `([^`]+)`", lambda m: ("short ids", int(m[1]), int(m[2]),
                                                                      *number_range(m[3]))),
    ]
    for pattern, read in patterns:
        if match := re.fullmatch(pattern, text):
            return read(match)
    raise AssertionError(f"a type the test does not read: {cell!r}")


def schema_type(kind) -> tuple:
    from vrl.node import wire
    from vrl.node.messages import WeightedDigests
    from vrl.node.requests import BACKFILL_CURSOR_TABLES, BACKFILL_WATERMARK_MAX, SHORT_ID_BYTES, Cursor, ShortIds

    match kind:
        case wire.Bin(sizes=sizes):
            return ("bin", tuple(sorted(sizes)))
        case wire.Uint(low=low, high=high):
            return ("uint", low, high)
        case wire.Real(low=low, high=high):
            return ("float", low, high)
        case wire.Text(max_bytes=limit):
            return ("str", limit)
        case wire.Choice(members=members):
            return ("choice", frozenset(members))
        case wire.Texts(max_items=items, max_chars=chars):
            return ("strs", items, chars)
        case wire.Flag():
            return ("bool",)
        case wire.Blobs(min_items=low, max_items=high, max_bytes=limit):
            return ("bins", low, high, limit)
        case wire.Nullable(inner=inner):
            return ("nil or", schema_type(inner))
        case WeightedDigests(max_items=items):
            return ("pairs", items)
        case wire.Listed(item="hash", max_items=items):
            return ("hashes", items)
        case Cursor():
            return ("cursor", 1 + BACKFILL_CURSOR_TABLES, BACKFILL_CURSOR_TABLES, 0, BACKFILL_WATERMARK_MAX)
        case ShortIds(max_items=items):
            return ("short ids", SHORT_ID_BYTES, SHORT_ID_BYTES, 1, items)
    raise AssertionError(f"a wire type the test does not describe: {kind!r}")


def _field_tables() -> list[tuple[str, str, list[dict[str, str]]]]:
    """(message class name, where, rows as {name, type, meaning}) of every field table of a message."""
    found = []
    for doc, heading, name in [("network.md", "3.2", "SignedVerdict"), ("network.md", "3.3", "PolicyAnnouncement"),
                               ("network.md", "3.3.1", "BatchFile"),
                               ("training.md", "5. Step tickets", "StepVerdict")]:
        rows = table(doc, heading, "Field")
        found.append((name, f"{doc} §{heading}", [{"name": span(r["Field"]), "type": r["Type"], "meaning": r["Meaning"]}
                                                   for r in rows]))
    rows = table("network.md", "3.4", "field")
    found.append(("SamplingRequest", "network.md §3.4", [{"name": span(r["field"]), "type": r["type and range"],
                                                          "meaning": ""} for r in rows]))
    rows = table("network.md", "3.5", "field")
    found.append(("GroupRequest", "network.md §3.5", [{"name": span(r["field"]), "type": r["type and range"],
                                                       "meaning": ""} for r in rows]))
    rows = table("network.md", "6. Policy distribution", "map")
    for side, name in [("request", "BackfillRequest"), ("page", "BackfillPage")]:
        found.append((name, f"network.md §6 {side}", [{"name": span(r["field"]), "type": r["type and range"],
                                                       "meaning": ""} for r in rows if r["map"] == side]))
    return found


FIELD_TABLES = _field_tables()


@pytest.mark.parametrize(("name", "where", "rows"), FIELD_TABLES, ids=[w for _, w, _ in FIELD_TABLES])
def test_message_field_tables_are_the_wire_schemas_both_ways(name, where, rows):
    """Each field a table lists is one the message declares, of the type and within the bounds
    the table gives, and the table lists every field; ``kind`` and ``v`` are the message's, and
    ``v``'s note names the fields each version added."""
    from vrl.node import messages, requests, wire

    schema = wire.schema_of(getattr(messages, name, None) or getattr(requests, name))
    stated = {row["name"]: row for row in rows}
    assert set(stated) == set(schema.keys), f"specs/{where} lists other fields than {name} declares"
    for field in schema.fields:
        row = stated[field.name]
        declared = ("absent or", schema_type(field.type)) if field.optional else schema_type(field.type)
        assert stated_type(row["type"], row["meaning"]) == declared, \
            f"specs/{where}: {field.name} is {row['type']}, but {name} declares {field.type}"
    if schema.version is not None:
        assert spans(stated["kind"]["meaning"]) == [f'"{schema.name}"']
        version, *_ = spans(stated["v"]["meaning"])
        assert int(version) == schema.version
        added = {int(v): set(re.findall(r"`(\w+)`", names))
                 for v, names in re.findall(r"(\d+) added ((?:`\w+`(?:, | and )?)+)", stated["v"]["meaning"])}
        assert added == {v: {f.name for f in schema.fields if f.since == v} for v in range(2, schema.version + 1)
                         if any(f.since == v for f in schema.fields)}


def test_the_group_message_is_the_submission_schema():
    """specs/network.md §3.1 writes the group message out, and its records' count, in prose."""
    from vrl.node import wire
    from vrl.node.messages import Submission

    section, schema = read("network.md", "3.1"), wire.schema_of(Submission)
    kind, version, name = re.search(r'\{"kind": "(\w+)", "v": (\d+), "(\w+)": \[record bytes', section).groups()
    (records,) = schema.fields
    assert (kind, int(version), name) == (schema.name, schema.version, records.name)
    low, high = re.search(r"`(\d+) \.\.= (\d+)` of them", section).groups()
    assert schema_type(records.type) == ("bins", int(low), int(high), None)


def test_verdict_fields_are_the_verifiers_both_ways():
    from vrl.rollouts.verify import Reason, Stage, Verdict

    stated = {span(row["Field"]) for row in table("verification.md", "3. Verdict", "Field")}
    assert stated == {field.name for field in dataclasses.fields(Verdict)}
    # "JSON form (Verdict.to_json): the same keys except `recomputed`"
    assert set(Verdict(0, True, Stage.ACCEPTED, Reason.OK, "").to_json()) == stated - {"recomputed"}


# -- domain tags ---------------------------------------------------------------------------------


def test_every_domain_tag_the_code_uses_is_in_the_readme_with_its_length():
    rows = table("README.md", "Conventions", "Tag (Python bytes literal)")
    stated = {value(span(row["Tag (Python bytes literal)"])): row for row in rows}
    for tag, row in stated.items():
        assert len(tag) == int(row["Length"]), f"{tag!r} is {len(tag)} bytes, not {row['Length']}"
    used = set()
    for package in ("vrl", "proofs", "p2p"):
        for path in sorted((ROOT / package).rglob("*.py")):
            used |= {tag for tag in bytes_literals(path.read_text(encoding="utf-8")) if tag.startswith(b"vrl/")}
    assert used - set(stated) == set(), "domain tags the code uses that specs/README.md does not list"
    assert set(stated) - used == set(), "domain tags specs/README.md lists that no code uses"


# -- tolerances ----------------------------------------------------------------------------------


def test_tolerance_table_is_the_verifiers_field_by_field():
    """specs/verification.md §5.2 names every tolerance, and §5.3's rows are the table's
    (specs/tolerances.json, whose shipped copy the verifier loads), to the 3 digits they are written with."""
    from vrl.rollouts.profiles import Tolerances
    from vrl.rollouts.profiles import table as profiles

    stated = {span(row["Tolerance"]) for row in table("verification.md", "5.2 The table", "Tolerance")}
    assert stated == {field.name for field in dataclasses.fields(Tolerances)}
    rows = table("verification.md", "5.3 Calibration", "Profile")
    assert {span(row["Profile"]) for row in rows} == set(profiles()), "the profiles §5.3 lists"
    for row in rows:
        profile = profiles()[span(row["Profile"])]
        for name in stated:
            assert float(row[f"`{name}`"]) == pytest.approx(getattr(profile.tolerances, name), rel=5e-3, abs=0), name
        assert float(row["`race_loss_rate`"]) == pytest.approx(profile.race_loss_rate, rel=5e-3)


def test_the_package_ships_the_tolerance_table_of_the_specs_byte_for_byte():
    """A wheel has no specs/, so the verifier reads the copy the package ships
    (vrl.rollouts.profiles.TABLE_FILE); specs/tolerances.json stays the source of truth."""
    from vrl.rollouts.profiles import TABLE_FILE

    assert TABLE_FILE.read_bytes() == (ROOT / "specs" / "tolerances.json").read_bytes()


# -- sampling parameters and presets ---------------------------------------------------------------


def _range(cell: str) -> tuple[float, float, bool, bool]:
    """``lo .. hi`` or ``lo <= X <= hi`` / ``lo < X <= hi``: (lo, hi, lo included, hi included)."""
    for span in spans(cell):
        if match := re.fullmatch(r"(\S+) \.\. (\S+)", span):
            return value(match.group(1)), value(match.group(2)), True, True
        if match := re.fullmatch(r"(\S+) (<=?) \w+ (<=?) (\S+)", span):
            return value(match.group(1)), value(match.group(4)), match.group(2) == "<=", match.group(3) == "<="
    raise AssertionError(f"no range in {cell!r}")


def test_sampling_parameter_ranges_are_the_samplers():
    """specs/sampler.md §1: each bound is accepted, and the next value past it refused."""
    from proofs.errors import InvalidParameters
    from proofs.sampler import SamplingParams

    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 16, "stop_token_ids": ()}
    checked = 0
    for row in table("sampler.md", "1. Sampling parameters and masks", "Field"):
        name = span(row["Field"])
        if name == "stop_token_ids":
            (bound,) = [value(s.split("< ")[1]) for s in spans(row["Range"]) if s.startswith("< ")]
            SamplingParams(**{**base, name: (bound - 1,)})
            with pytest.raises(InvalidParameters):
                SamplingParams(**{**base, name: (bound,)})
            checked += 1
            continue
        low, high, low_in, high_in = _range(row["Range"])
        integral = isinstance(base[name], int)
        for edge, included, outward in ((low, low_in, -1), (high, high_in, 1)):
            past = edge + outward if integral else math.nextafter(edge, outward * math.inf)
            inside = edge if included else (edge - outward if integral else math.nextafter(edge, -outward * math.inf))
            SamplingParams(**{**base, name: type(base[name])(inside)})
            with pytest.raises(InvalidParameters):
                SamplingParams(**{**base, name: type(base[name])(past if included else edge)})
        checked += 1
    assert checked == 5


def test_presets_are_the_codes():
    from vrl.rollouts.presets import PRESETS

    columns = {"hidden": "hidden", "intermediate": "intermediate", "layers": "layers", "heads": "heads",
               "kv_heads": "kv_heads", "vocab (LM head)": "vocab", "context": "max_positions"}
    rows = table("record.md", "5. Model identity", "Preset")
    assert {span(row["Preset"]) for row in rows} == set(PRESETS)
    for row in rows:
        preset = PRESETS[span(row["Preset"])]
        for column, field in columns.items():
            assert getattr(preset, field) == int(row[column]), (row["Preset"], column)
        assert preset.tie_embeddings is {"yes": True, "no": False}[row["tied"]]


# -- the audit ---------------------------------------------------------------------------------


def test_audit_checks_and_finding_codes_are_the_codes_both_ways():
    import vrl.audit

    rows = table("audit.md", "3. Checks", "Check")
    assert [span(row["Check"]) for row in rows] == list(vrl.audit.CHECKS)
    stated = {code for row in rows for code in spans(row["Codes (severity)"])}
    made = set()
    for path in sorted((ROOT / "vrl" / "audit").glob("*.py")):
        # finding(check, "code", ...): the code is the second argument, always a literal
        made |= set(re.findall(r'finding\(\s*(?:check|"\w+")\s*,\s*"(\w+)"', path.read_text(encoding="utf-8")))
    made |= {"bad_signature", "undecodable"}  # chosen by an expression in index_run, both literals there
    from vrl.audit.committees import CLAIM_CODES

    made |= set(CLAIM_CODES)  # a claim's refusal picks one of these (vrl.audit.committees._refusal)
    assert made and stated == made, (stated - made, made - stated)


def test_every_code_block_of_the_docs_is_closed():
    """An unclosed ``` fence turns the rest of a document into one code block (the README's
    chat example once swallowed "Choosing the reward" and all after it)."""
    for doc in [ROOT / "README.md", *sorted(SPECS.glob("*.md")), *sorted((ROOT / "bench").rglob("*.md"))]:
        fences = [n for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
                  if line.lstrip().startswith("```")]
        assert len(fences) % 2 == 0, f"{doc.name}: the fence at line {fences[-1]} is never closed"
