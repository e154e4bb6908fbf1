"""Reward specs (specs/rewards.md): the built-ins, the spec's wire form and identity, the v2
mapping, committed references, the code sandbox, entry points and the verifier's refusal of a
reward it does not have."""

from __future__ import annotations

import math
import os
import sys
import textwrap
import time
from fractions import Fraction
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vrl
from tests.conftest import ROUND, TASKS
from vrl.rollouts import codec
from vrl.rollouts.record import RecordError, Rollout
from vrl.rollouts.verify import Reason, Stage, verify
from vrl.tasks import RewardSpec, RewardTerm, Task, parse_spec, sandbox, term
from vrl.tasks.answers import answers_match, extract_answer, has_format
from vrl.tasks.rewards import (
    BUILT_IN,
    PYTHON,
    RewardError,
    RewardUnavailable,
    RewardUnknown,
    canonical_bytes,
    parse_term,
    registry,
)
from vrl.tasks.sandbox import MAX_CODE_BYTES, code_reward, extract_code, run_tests

COMMITTED = "zk:" + "ab" * 32


def score(texts: list[str], reference: str, completion: str) -> float:
    return parse_spec(texts).reward(Task("t", "", reference), completion)


# -- the built-ins -------------------------------------------------------------------------------


def test_the_default_is_the_exact_answer_untagged():
    assert RewardSpec().terms == (RewardTerm("answer", 1, 1.0, (("tag", ""),)),)
    assert score(["answer"], "5", "so it is \\boxed{5}") == 1.0
    assert score(["answer"], "1/2", "0.5") == 1.0
    assert score(["answer:tag=answer"], "Paris", "<answer> paris </answer>") == 0.0  # text, after normalizing
    assert score(["answer:tag=answer"], "Paris", "<answer> Paris </answer>") == 1.0
    assert score(["answer"], "Paris", "Paris") == 0.0  # untagged, only a number is an answer


@pytest.mark.parametrize(("reference", "given", "tolerances", "expected"), [
    ("100", "100.9", "abs_tol=1.0", 1.0),
    ("100", "101", "abs_tol=1.0", 1.0),  # the bound itself is within
    ("100", "101.0001", "abs_tol=1.0", 0.0),
    ("-200", "-181", "rel_tol=0.1", 1.0),
    ("-200", "-179", "rel_tol=0.1", 0.0),
    ("0", "0.001", "rel_tol=0.5", 0.0),  # relative to zero is nothing
    ("3.14159", "\\frac{22}{7}", "abs_tol=0.01", 1.0),
    ("abc", "abc", "abs_tol=1.0", 0.0),  # a reference that is not a number never matches
])
def test_numeric_with_tolerance_is_exact_over_the_rationals(reference, given, tolerances, expected):
    assert score([f"numeric:tag=answer,{tolerances}"], reference, f"<answer>{given}</answer>") == expected


def test_numeric_tolerance_is_the_decimal_the_float_reads_as():
    """0.3 as a float64 is a little below 3/10; the tolerance is 3/10 all the same, as written."""
    assert Fraction(0.3) < Fraction(3, 10)
    assert score(["numeric:abs_tol=0.3"], "0", "0.3") == 1.0
    assert score(["numeric:abs_tol=0.3"], "0", "0.3000000000000000001") == 0.0
    assert score(["numeric:rel_tol=0.1"], "30", "33") == 1.0


@pytest.mark.parametrize(("completion", "expected"), [
    ("<answer>C</answer>", 1.0), ("<answer>(C)</answer>", 1.0), ("<answer> C. </answer>", 1.0),
    ("<answer>c</answer>", 0.0), ("<answer>E</answer>", 0.0), ("<answer>C or D</answer>", 0.0), ("C", 0.0),
])
def test_multiple_choice_with_a_tag(completion, expected):
    assert score(["choice:tag=answer,choices=ABCD"], "C", completion) == expected


def test_multiple_choice_without_a_tag_takes_the_last_allowed_letter():
    assert score(["choice:choices=ABCD"], "(B)", "Between A and B, I choose B.") == 1.0
    assert score(["choice:choices=ABCD"], "B", "B? No: the answer is D") == 0.0
    assert score(["choice:choices=ABCD"], "B", "B, surely, not E") == 1.0  # E is not a choice
    assert score(["choice:choices=ABCD"], "B", "BA is not a letter") == 0.0


def test_format_and_length_penalty():
    assert score(["format:tag=answer"], "5", "<answer>7</answer>\n") == 1.0
    assert score(["format:tag=answer"], "5", "<answer>7</answer> and more") == 0.0
    penalty = ["length-penalty:free=10,span=20"]
    assert score(penalty, "", "x" * 10) == 0.0
    assert score(penalty, "", "x" * 15) == -0.25
    assert score(penalty, "", "x" * 30) == -1.0 == score(penalty, "", "x" * 1000)
    assert score(penalty, "", "é" * 15) == -0.25  # code points, not bytes


@given(st.text(max_size=60), st.sampled_from(["5", "1/2", "-3", "x"]), st.floats(0, 10), st.floats(0, 10),
       st.sampled_from(["", "answer"]))
@settings(max_examples=300, deadline=None)
def test_the_v2_reward_is_its_spec(completion, reference, correct, format_, tag):
    """specs/rewards.md §2: the v2 record's (correct, format, tag) and its spec agree exactly."""
    if format_ and not tag:
        return
    spec = RewardSpec.legacy(correct, format_, tag)
    task = Task("t", "", reference)
    formula = correct if answers_match(extract_answer(completion, tag or None), reference) else 0.0
    if format_ and has_format(completion, tag):
        formula += format_
    assert spec.reward(task, completion) == formula
    assert spec.as_legacy() == (correct, format_, tag)


def test_terms_are_summed_in_order_with_their_weights():
    spec = parse_spec(["answer:2:tag=answer", "format:0.1", "length-penalty:0.5:free=0,span=100"])
    completion = "<answer>5</answer>"
    assert spec.reward(Task("t", "", "5"), completion) == ((0.0 + 2.0) + 0.1) + 0.5 * -(18 / 100)
    assert spec.is_correct(Task("t", "", "5"), completion)
    assert not parse_spec(["format"]).is_correct(Task("t", "", "5"), completion)  # nothing checks the answer


# -- text forms, identity and the wire --------------------------------------------------------------


def test_term_text_forms():
    assert parse_term("answer") == term("answer")
    assert parse_term("format:0.1") == term("format", 0.1, tag="answer")
    assert parse_term("numeric/v1:2:abs_tol=1,rel_tol=0.5") == term("numeric", 2.0, abs_tol=1.0, rel_tol=0.5)
    assert str(parse_term("choice:choices=AB")) == "choice/v1:1:choices=AB,tag="
    for text, problem in [("nope", "no reward named 'nope'"), ("answer/v9", "answer/v9 is not installed"),
                          ("answer:x", "neither a weight"), ("numeric:abs_tol=a", "is not a float"),
                          ("answer:size=1", "has no parameter 'size'"), ("format:tag=", "tag must be"),
                          ("choice:choices=ABA", "distinct uppercase"), ("code:time_ms=5", "time_ms must be"),
                          ("answer:inf", "finite")]:
        with pytest.raises(RewardError, match=problem):
            parse_term(text)
    with pytest.raises(RewardError, match="appears twice"):
        parse_spec(["answer", "answer:tag=answer"])


def test_the_identities_encoding_is_the_records():
    spec = parse_spec(["numeric:abs_tol=0.5,tag=answer", "choice:choices=ABCDE", "length-penalty:-1:free=0"])
    assert canonical_bytes(spec.to_wire()) == codec.canonical_bytes(spec.to_wire())


def test_identity_covers_name_version_and_params_but_not_weight():
    a, b = term("numeric", abs_tol=0.5), term("numeric", 3.0, abs_tol=0.5)
    assert a.identity() == b.identity() and RewardSpec((a,)).digest() != RewardSpec((b,)).digest()
    assert term("numeric", abs_tol=0.25).identity() != a.identity()
    assert RewardTerm("numeric", 2, 1.0, a.params).identity() != a.identity()


def test_wire_round_trip_and_strict_params():
    spec = parse_spec(["answer:tag=answer", "format:0.1", "code"])
    assert RewardSpec.from_wire(msgpack.unpackb(msgpack.packb(spec.to_wire()))) == spec
    wire = spec.to_wire()
    for change, problem in [({"params": {"tag": "answer", "extra": 1}}, "exactly the parameters"),
                            ({"params": {}}, "exactly the parameters"),
                            ({"params": {"tag": 5}}, "expected str"),
                            ({"weight": 1}, "finite float64"), ({"weight": 2e6}, "finite float64"),
                            ({"version": 0}, "integer in"), ({"name": "Answer"}, "a reward name")]:
        with pytest.raises(RewardError, match=problem):
            RewardSpec.from_wire([{**wire[0], **change}])
    bad_time = {**wire[2], "params": {**wire[2]["params"], "time_ms": 10}}
    with pytest.raises(RewardError, match="time_ms"):
        RewardSpec.from_wire([bad_time])
    # A function this machine does not have decodes, to be refused by name when verified.
    unknown = RewardSpec.from_wire([{"name": "acme.sql", "version": 2, "weight": 1.0, "params": {"db": "x"}}])
    assert unknown.unknown() == ["acme.sql/v2"]
    with pytest.raises(RewardUnknown, match="acme.sql/v2 is not installed"):
        unknown.reward(Task("t", "", "5"), "5")


_PARAM_VALUES = st.one_of(st.text(max_size=8), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                          st.booleans(), st.none(), st.binary(max_size=4), st.lists(st.integers(), max_size=2))
_TERMS = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.sampled_from([f.name for f in BUILT_IN] + ["acme"]), st.text(max_size=5), st.integers()),
    "version": st.one_of(st.integers(-2, 70000), st.floats(), st.booleans()),
    "weight": st.one_of(st.floats(allow_nan=True), st.integers(-3, 3)),
    "params": st.one_of(st.dictionaries(st.one_of(st.sampled_from(["tag", "abs_tol", "rel_tol", "choices", "free",
                                                                   "span", "time_ms", "memory_mb", "python"]),
                                                  st.text(max_size=4), st.integers()), _PARAM_VALUES, max_size=4),
                        st.lists(st.integers(), max_size=2)),
    "other": st.integers(),
})


@given(st.one_of(st.lists(st.one_of(_TERMS, _PARAM_VALUES), max_size=4), _PARAM_VALUES,
                 st.dictionaries(st.text(max_size=3), _PARAM_VALUES, max_size=2)))
@settings(max_examples=500, deadline=None)
def test_any_wire_value_is_a_spec_or_a_reward_error(wire):
    try:
        spec = RewardSpec.from_wire(wire)
    except RewardError as error:
        assert error.field.startswith("reward_spec")
        return
    assert RewardSpec.from_wire(spec.to_wire()) == spec
    for t in spec.terms:
        if (t.name, t.version) in registry():
            assert set(dict(t.params)) == set(registry()[(t.name, t.version)].defaults)


@given(st.lists(_TERMS, max_size=3))
@settings(max_examples=200, deadline=None)
def test_any_reward_spec_in_a_record_decodes_or_is_a_record_error(honest, wire):
    """The record decoder's boundary: any reward_spec value is a record or a RecordError."""
    base = msgpack.unpackb(honest[0].to_bytes(), raw=False)
    try:
        data = codec.canonical_bytes({**base, "reward_spec": wire})
    except (OverflowError, TypeError):  # an int past 64 bits has no msgpack encoding at all
        return
    try:
        rollout = Rollout.from_bytes(data)
    except RecordError as error:
        assert error.field.startswith("reward_spec") or error.field == ""
        return
    assert rollout.reward_spec.to_wire() == wire


# -- committed references -----------------------------------------------------------------------------


def test_a_committed_reference_takes_only_the_provable_answer_term():
    task = Task("t", "", COMMITTED)
    spec = parse_spec(["answer:tag=answer", "format:0.5", "length-penalty:1:free=10,span=10"])
    assert spec.provable() is None
    completion = "<answer>5</answer>"  # 18 characters: 8 past free
    assert spec.reward_given(True, completion) == 1.0 + 0.5 - 0.8
    assert spec.public_reward(task, completion) == spec.reward_given(False, completion) == 0.5 - 0.8
    assert spec.given_form(completion) == b"n:5"
    for clear in (["numeric:abs_tol=1"], ["choice"], ["code"], ["answer", "numeric"]):
        refused = parse_spec(clear)
        assert "needs the reference in the clear" in refused.provable()
        with pytest.raises(RewardError, match="in the clear"):
            refused.public_reward(task, completion)
    with pytest.raises(ValueError, match="committed reference"):
        spec.reward(task, completion)  # never compared as text


# -- the code sandbox --------------------------------------------------------------------------------

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
CODE = dict(term("code", time_ms=2000, memory_mb=256).params)


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{textwrap.dedent(code).strip()}\n```\nDone."


# Where the sandbox cannot be made (not Linux, a container that refuses namespaces) code/v1 is
# not computable: that is tested below; the rest needs a machine that can run it.
sandboxed = pytest.mark.skipif(sandbox.sandbox_problem() is not None, reason=str(sandbox.sandbox_problem()))


@sandboxed
def test_a_record_scored_again_in_one_process_runs_its_code_once(monkeypatch):
    """A trainer scores each record when generating, verifying and measuring its batch: the
    child runs once per code, tests and limits (vrl.tasks.sandbox.SCORES_KEPT)."""
    from vrl.tasks import sandbox

    runs = []

    def counted(*args):
        runs.append(args)
        return run_tests(*args)

    monkeypatch.setattr(sandbox, "run_tests", counted)
    body = f"def add(a, b):\n    return a + b  # {os.getpid()} {len(sandbox._scores)}"
    assert [code_reward(fenced(body), TESTS, CODE) for _ in range(3)] == [1.0] * 3
    assert len(runs) == 1
    assert code_reward(fenced(body), TESTS, {**CODE, "time_ms": CODE["time_ms"] + 1}) == 1.0  # other limits
    assert len(runs) == 2


@sandboxed
@pytest.mark.parametrize(("code", "expected"), [
    ("def add(a, b):\n    return a + b", 1.0),
    ("def add(a, b):\n    return a - b", 0.0),
    ("def add(a, b):\n    raise ValueError", 0.0),
    ("import os\nos._exit(0)", 0.0),  # exits early with status 0: the runner's nonce is missing
    ("import sys\nsys.exit(0)", 0.0),
    ("def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    raise SystemExit(1)", 1.0),
    ("while True:\n    pass", 0.0),  # CPU limit / deadline
    ("x = bytearray(1 << 30)\ndef add(a, b):\n    return a + b", 0.0),  # past the 256 MiB address space
    ("open('new.txt', 'w').write('x')\ndef add(a, b):\n    return a + b", 0.0),  # the directory is read-only
    # The tests were read before the code ran: rewriting them (even after a chmod, which the
    # files' owner may do) changes nothing.
    ("open('tests.py', 'w').write('')\ndef add(a, b):\n    return 0", 0.0),
    ("import os\nos.chmod('tests.py', 0o644)\nopen('tests.py', 'w').write('')\ndef add(a, b):\n    return 0", 0.0),
    ("import os\nassert {os.stat(f).st_mode & 0o777 for f in ('solution.py', 'tests.py')} == {0o444}\n"
     "def add(a, b):\n    return a + b", 1.0),
    ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\ndef add(a, b):\n    return a + b", 0.0),
    ("import os\nos.fork()\ndef add(a, b):\n    return a + b", None),  # refused unless root; either way it dies
])
def test_code_runs_against_the_tests_in_a_limited_child(code, expected):
    result = code_reward(fenced(code), TESTS, CODE)
    if expected is None:
        assert result in (0.0, 1.0)
    else:
        assert result == expected


@sandboxed
@pytest.mark.parametrize("then", ["", "import time\ntime.sleep(30)"])
def test_no_process_the_code_starts_outlives_its_verdict(tmp_path, then):
    """Code that forks, detaches with setsid() and forks again a sleeper that would write a
    file after the deadline (as root, RLIMIT_NPROC does not stop the forks): the sleeper dies
    with the child's PID namespace, whether the code returns or is killed at the deadline."""
    marker = tmp_path / "escaped"
    name = f"vrl-esc-{os.getpid() % 10000}".encode()
    code = f"""
    import ctypes, os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0)  # PR_SET_NAME: found below by name
            time.sleep(4)
            open({str(marker)!r}, "w").write("outlived its verdict")
        os._exit(0)
    def add(a, b):
        return a + b
    {then}
    """
    limits = {**CODE, "time_ms": 1000}  # the watchdog's deadline: 2 s after the start
    assert code_reward(fenced(code), TESTS, limits) == (0.0 if then else 1.0)
    for _ in range(60):  # up to 6 s, past the sleeper's 4 s: it never writes, and is gone
        assert not marker.exists()
        time.sleep(0.1)
    stray = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == name.decode()]
    assert not stray and not marker.exists()


def _comm(process: Path) -> str:
    try:
        return (process / "comm").read_text().strip()
    except OSError:
        return ""


@sandboxed
def test_code_is_the_last_python_block_and_bounded():
    assert extract_code("```python\na = 1\n```\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nplain\n```") is None
    assert code_reward("def add(a, b): return a + b", TESTS, CODE) == 0.0  # no block
    big = "def add(a, b):\n    return a + b\n" + "#" * MAX_CODE_BYTES
    assert code_reward(fenced(big), TESTS, CODE) == 0.0
    assert score(["code:time_ms=2000"], TESTS, fenced("def add(a, b):\n    return a + b")) == 1.0


@sandboxed
def test_the_child_sees_a_fixed_environment():
    """specs/rewards.md §3.6's list of what the child observes."""
    code = """
    import os, socket, sys
    assert os.environ.get("PYTHONHASHSEED") == "0" and "HOME" in os.environ and len(os.environ) <= 6
    assert hash("vrl") == %d
    assert not any("site-packages" in p for p in sys.path)
    assert os.getpid() == 1 and os.getuid() == 65534  # its own PID namespace; no uid mapped in its user one
    assert sys.stdin.closed and sys.argv == ["-c"] and sorted(os.listdir()) == ["solution.py", "stdout", "tests.py"]
    assert socket.if_nameindex() == [(1, "lo")]  # a network namespace of its own, down
    def add(a, b):
        return a + b
    """
    import subprocess
    fixed = subprocess.run([sys.executable, "-c", "print(hash('vrl'))"], env={"PYTHONHASHSEED": "0"},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert code_reward(fenced(code % int(fixed)), TESTS, CODE) == 1.0


def test_a_code_reward_names_its_python_and_another_is_not_computable_here():
    assert CODE["python"] == PYTHON == f"{sys.version_info.major}.{sys.version_info.minor}"
    other = term("code", python="3.99")
    assert other.identity() != term("code").identity()
    problem = RewardSpec((other,)).unavailable()
    assert problem and "Python 3.99" in problem[0] and PYTHON in problem[0]
    with pytest.raises(RewardUnavailable, match="Python 3.99"):
        RewardSpec((other,)).reward(Task("t", "", TESTS), fenced("def add(a, b):\n    return a + b"))
    with pytest.raises(RewardError, match="python must be a version"):
        parse_term("code:python=three")


def test_a_sandbox_that_cannot_start_is_not_computable_here(tmp_path, monkeypatch):
    """A verifier whose sandbox fails (here: no interpreter at its path) says so, never a score:
    the record is not the producer's fault."""
    monkeypatch.setattr(sandbox, "INTERPRETER", str(tmp_path / "no-python"))
    with pytest.raises(sandbox.SandboxUnavailable, match="cannot run here: FileNotFoundError"):
        run_tests("def add(a, b):\n    return a + b", TESTS, 1000, 256)
    assert "does not start" in sandbox.sandbox_problem()
    with pytest.raises(RewardUnavailable, match="not computable here"):
        RewardSpec((term("code"),)).reward(Task("t", "", TESTS), fenced("def add(a, b):\n    return a + b"))


# -- entry points ------------------------------------------------------------------------------------


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A real installed distribution: a module and a dist-info with entry_points.txt on sys.path,
    as pip would leave them; importlib.metadata finds it as it finds any other."""
    (tmp_path / "vrl_keyword_reward.py").write_text(textwrap.dedent("""
        from vrl.tasks.rewards import RewardFunction

        def _score(task, completion, params):
            return float(params["word"] in completion)

        KEYWORD = RewardFunction("acme.keyword", 1, {"word": "please"}, _score, uses_reference=False)
        NOT_A_REWARD = 42
        CLASH = RewardFunction("answer", 1, {}, _score)
    """))
    info = tmp_path / "vrl_keyword_reward-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vrl-keyword-reward\nVersion: 0.1\n")
    points = info / "entry_points.txt"
    points.write_text("[vrl.rewards]\nkeyword = vrl_keyword_reward:KEYWORD\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.cache_clear()
    yield points
    registry.cache_clear()
    sys.modules.pop("vrl_keyword_reward", None)


def test_an_installed_reward_is_found_through_its_entry_point(plugin):
    assert ("acme.keyword", 1) in registry()
    spec = parse_spec(["answer", "acme.keyword:0.5:word=thanks"])
    assert spec.reward(Task("t", "", "5"), "5, thanks") == 1.5
    assert spec.provable() is None  # it does not read the reference


@pytest.mark.parametrize(("line", "problem"), [
    ("bad = vrl_keyword_reward:NOT_A_REWARD", "is a int, not a vrl.tasks.rewards.RewardFunction"),
    ("clash = vrl_keyword_reward:CLASH", "defines answer/v1, which vrl already defines"),
    ("missing = vrl_keyword_reward_nowhere:X", "does not load: ModuleNotFoundError"),
])
def test_a_broken_entry_point_is_named(plugin, line, problem):
    plugin.write_text(f"[vrl.rewards]\n{line}\n")
    registry.cache_clear()
    with pytest.raises(RewardError, match=problem):
        registry()


# -- the verifier ---------------------------------------------------------------------------------------


def test_a_verifier_without_the_reward_refuses_it_by_name(tiny, node, sampling, plugin):
    """Rollouts rewarded with an installed function verify; a verifier without the package
    rejects the same records as reward_unknown, before any model work, never accepts them."""
    spec = parse_spec(["answer", "acme.keyword:0.5:word=5"])
    group = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=1, group_size=2,
                         reward_spec=spec)
    assert all(v.accepted for v in verify(group, tiny)), [v.message for v in verify(group, tiny)]
    wire = [Rollout.from_bytes(r.to_bytes()) for r in group]
    plugin.write_text("")  # the package uninstalled
    registry.cache_clear()
    decoded = [Rollout.from_bytes(r.to_bytes()) for r in group]
    assert decoded == wire
    for verdict in verify(decoded, tiny):
        assert (verdict.stage, verdict.reason, verdict.accepted) == (Stage.BINDING, Reason.REWARD_UNKNOWN, False)
        assert "acme.keyword/v1" in verdict.message and "not have installed" in verdict.message


def test_a_committed_reference_with_a_reward_it_cannot_prove_is_rejected(tiny, node, sampling):
    spec = parse_spec(["numeric:abs_tol=1"])
    tasks = vrl.TaskList("private", (Task("p", "1+1=", COMMITTED),))
    group = vrl.generate(tiny, tasks, node, round_seed=ROUND, sampling=sampling, groups=1, group_size=2,
                         score=lambda task, completion: 0.0, reward_spec=spec)
    for verdict in verify(group, tiny):
        assert (verdict.reason, verdict.stage) == (Reason.REWARD_UNPROVEN, Stage.REWARD)
        assert "in the clear" in verdict.message


def test_a_weight_must_be_finite_and_bounded():
    for weight in (math.nan, math.inf, 2e6):
        with pytest.raises(RewardError, match="finite"):
            term("answer", weight)


def test_a_reward_function_that_fails_is_a_reward_mismatch(tiny, node, sampling, plugin):
    """An installed function that raises, or returns no finite float, on some completion: that
    record is rejected as reward_mismatch, naming the function; the verifier does not crash."""
    plugin.write_text("[vrl.rewards]\nfragile = vrl_fragile_reward:FRAGILE\n")
    (plugin.parent.parent / "vrl_fragile_reward.py").write_text(textwrap.dedent("""
        from vrl.tasks.rewards import RewardFunction

        def _score(task, completion, params):
            if params["mode"] == "raise":
                raise ZeroDivisionError("division by zero")
            return float("nan") if params["mode"] == "nan" else 1.0

        FRAGILE = RewardFunction("acme.fragile", 1, {"mode": "ok"}, _score, uses_reference=False)
    """))
    registry.cache_clear()
    group = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=1, group_size=2,
                         reward_spec=parse_spec(["acme.fragile"]))
    for mode, problem in (("raise", "ZeroDivisionError"), ("nan", "not a finite float")):
        spec = parse_spec([f"acme.fragile:mode={mode}"])
        changed = [r.signed(node, reward_spec=spec) for r in group]
        for verdict in verify(changed, tiny):
            assert (verdict.reason, verdict.stage) == (Reason.REWARD_MISMATCH, Stage.REWARD)
            assert "acme.fragile/v1" in verdict.message and problem in verdict.message
    sys.modules.pop("vrl_fragile_reward", None)


def test_a_verifier_that_cannot_compute_a_reward_says_reward_unknown_not_mismatch(tiny, node, sampling, tmp_path,
                                                                                   monkeypatch):
    """Records rewarded with code/v1 under another Python, or checked by a verifier whose
    sandbox cannot start, are reward_unknown before any model work: the verifier's limitation,
    never reward_mismatch against an honest producer."""
    group = vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=1, group_size=2,
                         reward_spec=parse_spec(["answer", "code"]))  # no code block: 0 without running
    pinned = RewardSpec((term("answer"), term("code", python="3.99")))  # code runs only under a pinned spec
    other = [r.signed(node, reward_spec=pinned) for r in group]
    for verdict in verify(other, tiny, expect=vrl.Expectations(reward_spec=pinned)):
        assert (verdict.stage, verdict.reason) == (Stage.BINDING, Reason.REWARD_UNKNOWN)
        assert "code/v1" in verdict.message and "Python 3.99" in verdict.message
    monkeypatch.setattr(sandbox, "INTERPRETER", str(tmp_path / "no-python"))
    for verdict in verify(group, tiny, expect=vrl.Expectations(reward_spec=group[0].reward_spec)):
        assert verdict.reason == Reason.REWARD_UNKNOWN and "does not start" in verdict.message


@pytest.fixture
def strict_plugin(plugin):
    """An installed function with int and float parameters whose check raises on one value."""
    (plugin.parent.parent / "vrl_strict_reward.py").write_text(textwrap.dedent("""
        from vrl.tasks.rewards import RewardFunction

        def _check(params):
            if params["n"] == 13:
                raise KeyError("unlucky")
            return None

        STRICT = RewardFunction("acme.strict", 1, {"n": 0, "x": 0.0, "s": ""}, lambda t, c, p: 0.0, _check,
                                uses_reference=False)
        ANSWER2 = RewardFunction("answer", 2, {"tag": ""}, lambda t, c, p: 1.0)
    """))
    plugin.write_text("[vrl.rewards]\nstrict = vrl_strict_reward:STRICT\nanswer2 = vrl_strict_reward:ANSWER2\n")
    registry.cache_clear()
    yield
    sys.modules.pop("vrl_strict_reward", None)


def test_terms_are_made_only_with_values_a_record_can_carry(strict_plugin, honest):
    """term() and parse_term() refuse what the record decoder refuses; a plugin's check that
    raises is a RewardError (a RecordError in a record), never its own exception."""
    for made in (lambda: term("acme.strict", n=1 << 70), lambda: term("acme.strict", x=math.nan),
                 lambda: parse_term("acme.strict:s=" + "x" * 2000), lambda: parse_term("acme.strict:x=inf")):
        with pytest.raises(RewardError, match="int64, a finite float64"):
            made()
    with pytest.raises(RewardError, match="acme.strict/v1's _check raised KeyError"):
        term("acme.strict", n=13)
    base = msgpack.unpackb(honest[0].to_bytes(), raw=False)
    wire = [{"name": "acme.strict", "version": 1, "weight": 1.0, "params": {"n": 13, "x": 0.0, "s": ""}}]
    with pytest.raises(RecordError, match="raised KeyError"):
        Rollout.from_bytes(codec.canonical_bytes({**base, "reward_spec": wire}))


def test_only_answer_v1_is_the_exact_answer_term(strict_plugin):
    """A plugin's answer/v2 is another function: the default and v2 records keep answer/v1,
    and a committed reference's proof covers answer/v1 only."""
    assert RewardSpec().terms[0].id == RewardSpec.legacy(1.0).terms[0].id == "answer/v1"
    assert term("answer").id == "answer/v2"  # the newest installed, where a version is not named
    v2 = RewardSpec((term("answer/v2"),))
    assert "answer/v2" in v2.provable() and v2.given_form("5") is None
    with pytest.raises(RewardError, match="in the clear"):
        v2.reward_given(True, "5")


# -- choosing the reward: configs and the command line --------------------------------------------


def test_a_run_and_a_node_choose_their_reward_in_toml(tmp_path):
    from tests.test_config import write
    from vrl.config import ConfigError
    from vrl.node.config import NodeConfig
    from vrl.rl.train import TrainConfig

    run = tmp_path / "train.toml"
    run.write_text('reward = ["answer:tag=answer", "format:0.1", "length-penalty:0.2:free=100,span=50"]\n')
    assert TrainConfig.from_toml(run).reward_spec == parse_spec(
        ["answer:tag=answer", "format:0.1:tag=answer", "length-penalty:0.2:free=100,span=50"])
    run.write_text('reward_format = 0.1\nanswer_tag = "answer"\n')  # the v2 keys still say the same
    assert TrainConfig.from_toml(run).reward_spec == parse_spec(["answer:tag=answer", "format:0.1"])
    for text, problem in [('reward = ["numeric:abs_tol=x"]\n', "reward[0]: 'numeric:abs_tol=x': abs_tol='x' is not"),
                          ('reward = ["answer", "answer"]\n', "reward: reward answer appears twice"),
                          ('reward = ["answer"]\nreward_format = 0.5\nanswer_tag = "a"\n', "reward: give the reward")]:
        run.write_text(text)
        with pytest.raises(ConfigError) as caught:
            TrainConfig.from_toml(run)
        assert str(caught.value).startswith(f"{run}: {problem}"), caught.value

    node = write(tmp_path, '[work]\nreward = ["choice:choices=ABCDE,tag=answer"]\n')
    assert NodeConfig.from_toml(node).work.reward_spec == parse_spec(["choice:choices=ABCDE,tag=answer"])
    assert NodeConfig.from_toml(write(tmp_path, "")).work.reward_spec == RewardSpec()
    with pytest.raises(ConfigError, match=r"\[work\] reward\[0\]: no reward named 'acme'"):
        NodeConfig.from_toml(write(tmp_path, '[work]\nreward = ["acme"]\n'))


def test_generate_takes_the_reward_and_refuses_one_a_private_task_set_cannot_prove(tmp_path):
    from typer.testing import CliRunner

    from vrl.cli import app

    runner = CliRunner()
    key = tmp_path / "node.pem"
    assert runner.invoke(app, ["keygen", "--out", str(key)]).exit_code == 0
    public = tmp_path / "tasks.jsonl"
    public.write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n')
    private = tmp_path / "private.jsonl"
    private.write_text(f'{{"id": "a", "prompt": "1+1=", "answer": "{COMMITTED}"}}\n')
    common = ["generate", "--model", "tiny", "--key", str(key), "--groups", "1", "--group-size", "2",
              "--max-new-tokens", "4"]
    out = tmp_path / "r.vrl"
    done = runner.invoke(app, [*common, "--task", str(public), "--out", str(out), "--reward", "numeric:abs_tol=1",
                               "--reward", "length-penalty:0.5:free=0,span=4"])
    assert done.exit_code == 0, done.output
    assert {r.reward_spec for r in vrl.iter_records(out)} == {parse_spec(["numeric:abs_tol=1", "length-penalty:0.5:"
                                                                          "free=0,span=4"])}
    bad = runner.invoke(app, [*common, "--task", str(public), "--out", str(tmp_path / "x.vrl"), "--reward", "nope"])
    assert bad.exit_code == 2 and "--reward no reward named 'nope'" in " ".join(bad.output.split())
    refused = runner.invoke(app, [*common, "--task", str(private), "--out", str(tmp_path / "y.vrl"),
                                  "--reward", "numeric"])
    assert refused.exit_code == 2 and "needs the reference in the clear" in " ".join(refused.output.split())
    assert not (tmp_path / "y.vrl").exists()
