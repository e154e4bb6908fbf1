"""bench/simulate.py's flag parsers: any text is a valid value or a one-line argparse error
naming the flag, never another exception (a user mistake is never a traceback); and the
command lines of bench/simulate.py and bench/devnet.py: a scenario by its first word."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import simulate  # noqa: E402
from simulate import (  # noqa: E402
    batch_groups_arg,
    budgets_arg,
    jobs_arg,
    protocol_arg,
    shares_arg,
    tokens_arg,
)

from vrl.node.params import ProtocolParams  # noqa: E402

texts = st.one_of(st.text(max_size=40), st.sampled_from(
    ["nan", "inf", "-1", "0", "1e999", "12", "round", "\u00b9", "\u0661", "submission_window=nan",
     "submission_window=120", "committee_size=abc", "=", "groups_per_round=", "verification=committee"]))


@settings(max_examples=300, deadline=None)
@given(texts)
def test_every_flag_parser_gives_a_value_or_an_argparse_error(text):
    for parse in (batch_groups_arg, jobs_arg, protocol_arg, tokens_arg):
        try:
            value = parse(text)
        except argparse.ArgumentTypeError:
            continue
        if parse is tokens_arg:
            assert math.isfinite(value) and 1 <= value <= 2**16
        if parse is jobs_arg:
            assert 1 <= value <= 1024
        if parse is protocol_arg:
            key, typed = value
            assert isinstance(typed, type(getattr(ProtocolParams(), key)))


def test_the_values_a_run_needs_parse():
    assert tokens_arg("16") == 16.0 and jobs_arg("3") == 3 and batch_groups_arg("round") == "round"
    assert protocol_arg("submission_window=120") == ("submission_window", 120.0)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_the_list_flags_give_a_list_or_an_argparse_error(text):
    """The scenarios' --shares and --budgets."""
    for parse in (shares_arg, budgets_arg):
        try:
            values = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert values
        if parse is shares_arg:
            assert all(0 <= v < 1 for v in values)
        else:
            assert all(isinstance(v, int) and 0 <= v <= 2**16 for v in values)
    assert shares_arg("0,0.1") == [0.0, 0.1] and budgets_arg("8,0") == [8, 0]


def test_a_scenario_is_named_by_the_first_word_and_one_run_by_none():
    args, runner = simulate.parse(["--nodes", "100", "--rounds", "20", "--design", "committee", "--json"])
    assert runner is simulate.one and (args.nodes, args.rounds, args.design, args.json) == (100, 20, "committee", True)
    args, runner = simulate.parse(["adversaries", "--shares", "0.3", "--families", "lazy", "--out", "a.json"])
    assert runner is simulate.adversaries and args.shares == [0.3] and args.batch_groups == "round"
    assert simulate.invocation(args) == "python bench/simulate.py adversaries --shares 0.3 --families lazy --out a.json"
    args, runner = simulate.parse(["withhold"])
    assert runner is simulate.withhold and args.nodes == [11, 50] and args.out is None


def test_the_devnet_driver_takes_each_scenarios_own_flags_and_defaults():
    import devnet  # bench/devnet.py

    args, runner = devnet.parse(["committee", "--nodes", "12", "--rounds", "8"])
    assert runner is devnet.network and (args.nodes, args.rounds, args.port, args.sample) == (12, 8, 25000, 0.1)
    args, runner = devnet.parse(["costs", "--nodes", "5", "12", "--designs", "committee"])
    assert runner is devnet.costs and args.nodes == [5, 12] and (args.rounds, args.port) == (5, 27300)
    assert devnet.invocation(args) == "python bench/devnet.py costs --nodes 5 12 --designs committee"
    args, runner = devnet.parse(["audit", "--model", "tiny"])
    assert runner is devnet.audit_costs and (args.port, args.rounds, args.nodes) == (None, 20, 5)
