"""node.toml: every key checked for its type, its range and its spelling, at the boundary; the
libraries' configs as its tables, each default defined once.

A user mistake is one line naming the file and the key, never a traceback; hostile files
(huge, NaN, wrong types, nested tables, raw bytes) end as a config or a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vrl.cli import app
from vrl.errors import MAX_SHOWN, VrlError, shown
from vrl.node.admission import AdmissionConfig
from vrl.node.config import NODE_OVERRIDES, ConfigError, NodeConfig
from vrl.node.protocol import ProtocolConfig, ProtocolParams
from vrl.node.reputation import ReputationConfig
from vrl.node.work import WorkConfig
from vrl.rl.config import GRPOConfig, LearnerConfig, TrainConfig
from vrl.rollouts.config import GenerationConfig
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"trainer".ljust(32, b"\0")).node_id.hex()
PEER = "12D3KooWNhcdA7EGHAEDzWqyqASp2ZjzzjVFzx2q5rchwgEYtFVj"  # an Ed25519 libp2p peer id (multiaddr_for)
REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'data_dir = "d"\ntrainer = "{TRAINER}"\n' + text, encoding="utf-8")
    return path


# What a node.toml from before the tables held at its top level: each key is told where it went.
FLAT_KEYS = {
    "model = 'base'": "model: belongs in the [work] table",
    "group_size = 8": "group_size: belongs in the [work] table",
    "temperature = 1.0": "temperature: belongs in the [work] table",
    "device = 'cpu'": "device: belongs in the [work] table",
    "groups_per_round = 4": "groups_per_round: belongs in the [protocol] table",
    "max_staleness = 2": "max_staleness: belongs in the [protocol] table",
    "plant_every = 2": "plant_every: belongs in the [protocol] table",
    "rounds = 8": "rounds: renamed: it is last_version in the [protocol] table",
    "batch_groups = 12": "batch_groups: belongs in the [admission] table",
    "node_cap = 0.34": "node_cap: belongs in the [admission] table",
    "warmup_steps = 5": "warmup_steps: belongs in the [train] table",
    "held_out = 128": "held_out: belongs in the [train] table",
}


# Each is a mistake a user makes, and the key the one-line error must name: a top-level key by
# its name, a table's as "[table] key".
MISTAKES = {
    '[work]\ngroup_size = "eight"': "[work] group_size",
    "[work]\ngroup_size = -4": "[work] group_size",
    "[work]\ngroup_size = 4.5": "[work] group_size",
    "[work]\ngroup_size = true": "[work] group_size",
    "[work]\ngroup_size = 100000": "[work] group_size",
    "metrics_port = 99999": "metrics_port",
    "metrics_port = -1": "metrics_port",
    'listen = "/ip4/127.0.0.1/tcp/99999"': "listen",
    'listen = "/ip4/300.0.0.1/tcp/4001"': "listen",
    'listen = "127.0.0.1:4001"': "listen",
    f'bootstrap = ["/ip4/127.0.0.1/tcp/99999/p2p/{PEER}"]': "bootstrap[0]",
    'bootstrap = ["/ip4/127.0.0.1/tcp/4001/p2p/QmNotAnEd25519Id"]': "bootstrap[0]",
    'bootstrap = ["/ip4/127.0.0.1/tcp/4001"]': "bootstrap[0]",
    f'bootstrap = "/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"': "bootstrap",
    'pretrusted = ["abcd"]': "pretrusted[0]",
    f'pretrusted = ["{TRAINER[:62]} {TRAINER[62:]}"]': "pretrusted[0]",  # bytes.fromhex would skip the space
    "[work]\ntemperature = nan": "[work] temperature",
    "[work]\ntemperature = inf": "[work] temperature",
    "[work]\ntemperature = 0.0": "[work] temperature",
    "[work]\ntemperature = 1e400": "[work] temperature",
    "[admission]\nnode_cap = 1.5": "[admission] node_cap",
    "[admission]\ntrusted_share = -0.1": "[admission] trusted_share",
    "[admission]\nbatch_groups = {a = 1}": "[admission] batch_groups",
    "[protocol]\nlazy_audit_rate = 2": "[protocol] lazy_audit_rate",
    "[protocol]\nverdict_wait = -1": "[protocol] verdict_wait",
    "[protocol]\nround_timeout = 0": "[protocol] round_timeout",
    "[protocol]\nmax_staleness = 1000": "[protocol] max_staleness",
    "[protocol]\nlast_version = 18446744073709551616": "[protocol] last_version",
    "[protocol]\ngroups_per_round = 0": "[protocol] groups_per_round",
    "[train]\nlearning_rate = 0": "[train] learning_rate",
    "[train]\nheld_out = 0": "[train] held_out",
    "[train]\neval_every = 2024-01-01": "[train] eval_every",
    "[grpo]\neps_low = 1.5": "[grpo] eps_low",
    '[grpo]\nadvantage = "rank"': "[grpo] advantage",
    "[grpo]\niterations = 0": "[grpo] iterations",
    "[grpo]\nmax_staleness = 4": "[grpo] max_staleness",
    "[reputation]\nconfidence = 1.0": "[reputation] confidence",
    "[reputation]\ndamping = 0": "[reputation] damping",
    "[reputation]\ndampening = 0.1": "[reputation] dampening",
    "torch_threads = 0": "torch_threads",
    "torch_threads = 10000000": "torch_threads",
    'roles = ["miner"]': "roles[0]",
    "roles = []": "roles",
    'roles = ["worker", "worker"]': "roles",
    '[work]\ndevice = "tpu"': "[work] device",
    '[work]\ndevice = "cuda:x"': "[work] device",
    'adversary = "bribery"': "adversary",
    'transport = "carrier-pigeon"': "transport",
    '[work]\ntask = "arithmetic:digits=0"': "[work] task",
    '[work]\ntask = ""': "[work] task",
    '[work]\nmodel = ""': "[work] model",
    'key = ""': "key",
    'key = "a\\u0000b"': "key",
    "[work]\nmax_new_tokens = -1": "[work] max_new_tokens",
    '[work]\ncolumns = "prompt"': "[work] columns",
    '[work]\ncolumns = "prmpt=question"': "[work] columns",
    "[work]\nmax_new_tokens = 2000000": "[work] max_new_tokens",
    "work = 8": "work",
    "port = 4001": "port",
    "group_sise = 8": "group_sise",
    **FLAT_KEYS,
}


@pytest.mark.parametrize("line", sorted(MISTAKES))
def test_a_mistake_is_one_error_naming_the_file_and_the_key(tmp_path, line):
    path = write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as caught:
        NodeConfig.from_toml(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {MISTAKES[line]}"), message
    assert "\n" not in message


def test_required_keys_and_trainer_are_named(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('data_dir = "d"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: trainer: required"):
        NodeConfig.from_toml(path)
    path.write_text('data_dir = "d"\ntrainer = "nothex"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: trainer: "):
        NodeConfig.from_toml(path)
    path.write_bytes(b'data_dir = "\xff"\n')
    with pytest.raises(ConfigError, match=rf"^{path}: .*UTF-8"):
        NodeConfig.from_toml(path)
    path.write_text("data_dir = \n")
    with pytest.raises(ConfigError, match=rf"^{path}: .*line 1"):
        NodeConfig.from_toml(path)


def test_a_huge_file_is_refused_without_reading_it_whole(tmp_path):
    path = write(tmp_path, "# " + "x" * (4 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        NodeConfig.from_toml(path)


def test_an_integer_too_long_to_print_is_still_one_config_error():
    with pytest.raises(ConfigError, match=r"^\[work\] group_size: must be in .*an integer of 16610 bits"):
        NodeConfig.from_dict({"data_dir": "d", "trainer": TRAINER, "work": {"group_size": 10**5000}})


def test_unknown_key_suggests_the_known_one(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'rols'.*did you mean 'roles'"):
        NodeConfig.from_toml(write(tmp_path, "rols = []\n"))


def test_values_are_normalized_and_relative_paths_are_resolved_once(tmp_path):
    path = write(tmp_path, f'bootstrap = ["/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"]\n'
                 '[work]\ntemperature = 1\ndevice = "cuda:1"\n')
    config = NodeConfig.from_toml(path)
    assert config.work.temperature == 1.0 and isinstance(config.work.temperature, float)
    assert config.bootstrap == (f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}",)
    assert config.data_dir == str(tmp_path / "d")
    # Written back and read again from elsewhere it is the same config: the path is absolute now.
    other = tmp_path / "elsewhere" / "node.toml"
    other.parent.mkdir()
    other.write_text(config.to_toml(), encoding="utf-8")
    assert NodeConfig.from_toml(other) == config


def test_the_devnets_own_addresses_are_valid():
    from p2p.libp2p_transport import multiaddr_for

    address = multiaddr_for(bytes.fromhex(TRAINER), "127.0.0.1", 29000)
    assert NodeConfig(data_dir="d", trainer=TRAINER, bootstrap=(address,)).bootstrap == (address,)
    with pytest.raises(ConfigError, match="bootstrap"):  # a loopback address on the libp2p transport
        NodeConfig(data_dir="d", trainer=TRAINER, bootstrap=(f"loopback/{TRAINER}",))
    loop = NodeConfig(data_dir="d", trainer=TRAINER, transport="loopback", bootstrap=(f"loopback/{TRAINER}",))
    assert loop.bootstrap == (f"loopback/{TRAINER}",)


def test_vrl_node_prints_one_line_for_a_bad_file(tmp_path):
    # The model is missing too, so that a node that took the file would stop at once, not run.
    path = write(tmp_path, '[work]\ngroup_size = "eight"\nmodel = "no-such-model"\n')
    result = CliRunner().invoke(app, ["node", "--config", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{path}: [work] group_size: expected an integer" in lines[0], result.output
    assert "Traceback" not in result.output


def test_vrl_node_prints_one_line_when_the_model_cannot_be_loaded(tmp_path):
    """Errors only the start finds (here: no such model) are one line too, naming file and key,
    and the process exits (the transport it had started is closed)."""
    path = write(tmp_path, 'transport = "libp2p"\n[work]\nmodel = "no-such-model"\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "vrl.cli", "node", "--config", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and f"{path}: [work] model: " in error[0], done.stderr


def test_start_checks_name_the_key(tmp_path):
    from vrl.node.run import preflight

    with pytest.raises(ConfigError, match=r"^\[work\] task: "):
        preflight(NodeConfig(data_dir=str(tmp_path), trainer=TRAINER, work={"task": str(tmp_path / "missing.jsonl")}))
    with pytest.raises(ConfigError, match=r"^\[work\] device: "):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA; the check needs a device it lacks")
        preflight(NodeConfig(data_dir=str(tmp_path), trainer=TRAINER, work={"device": "cuda"}))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="^data_dir: "):
        preflight(NodeConfig(data_dir=str(tmp_path / "file"), trainer=TRAINER))


# -- properties ---------------------------------------------------------------------------------

FIELDS = [f.name for f in dataclasses.fields(NodeConfig)]
HINTS = typing.get_type_hints(NodeConfig)
TABLES = {name: hint for name, hint in HINTS.items() if dataclasses.is_dataclass(hint)}  # node.toml's tables
toml_int = st.integers(-2**63, 2**63 - 1)  # TOML's integers are 64-bit
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.booleans(), toml_int, st.integers(), st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
    text, st.datetimes(), st.dates(), st.sampled_from(["", "\x00", "auto", "cuda:99", "loopback/" + TRAINER]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)
valid = st.fixed_dictionaries({"data_dir": st.just("d"), "trainer": st.just(TRAINER)}, optional={
    "metrics_port": st.integers(0, 65535),
    "roles": st.lists(st.sampled_from(["worker", "verifier", "trainer"]), min_size=1, max_size=3, unique=True),
    "listen": st.builds("/ip4/127.0.0.1/tcp/{}".format, st.integers(0, 65535)),
    "bootstrap": st.lists(st.builds(f"/ip4/10.0.0.1/tcp/{{}}/p2p/{PEER}".format, st.integers(1, 65535)), max_size=3),
    "torch_threads": st.integers(1, 64),
    "work": st.fixed_dictionaries({}, optional={
        "group_size": st.integers(2, 1024), "temperature": st.floats(0.01, 10),
        "device": st.sampled_from(["auto", "cpu", "cuda", "cuda:0", "cuda:7"])}),
    "admission": st.fixed_dictionaries({}, optional={"node_cap": st.floats(0.01, 1.0)}),
    "protocol": st.fixed_dictionaries({}, optional={"max_staleness": st.integers(0, 16)}),
    "grpo": st.fixed_dictionaries({}, optional={"eps_low": st.floats(0.01, 0.99), "kl_beta": st.floats(0, 10)})})
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_loads(data: dict) -> None:
    text_ = tomli_w.dumps(data)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "node.toml"
        path.write_text(text_, encoding="utf-8")
        try:
            config = NodeConfig.from_toml(path)
        except ConfigError as error:
            assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
            return
        # Accepted: a value that survives its own round trip (NaN never would).
        path.write_text(config.to_toml(), encoding="utf-8")
        assert NodeConfig.from_toml(path) == config


@FUZZ
@given(valid)
def test_valid_configs_load_and_round_trip(data):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "node.toml"
        path.write_text(tomli_w.dumps(data), encoding="utf-8")
        config = NodeConfig.from_toml(path)
        path.write_text(config.to_toml(), encoding="utf-8")
        assert NodeConfig.from_toml(path) == config


@FUZZ
@given(valid, st.lists(st.tuples(st.sampled_from(FIELDS) | text.filter(bool), values), min_size=1, max_size=3))
def test_mutated_configs_load_or_raise_config_error(data, changes):
    check_loads({**data, **dict(changes)})


@FUZZ
@given(valid, st.sampled_from(sorted(TABLES)), st.data())
def test_mutated_tables_load_or_raise_config_error(data, table, draw):
    """A table's keys, mutated or made up, with hostile values: a config or one ConfigError."""
    keys = [f.name for f in dataclasses.fields(TABLES[table])]
    changes = draw.draw(st.dictionaries(st.sampled_from(keys) | text.filter(bool), values, min_size=1, max_size=3))
    check_loads({**data, table: {**data.get(table, {}), **changes}})


@FUZZ
@given(st.binary(max_size=512) | text.map(str.encode))
def test_raw_bytes_load_or_raise_config_error(data):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "node.toml"
        path.write_bytes(data)
        try:
            NodeConfig.from_toml(path)
        except ConfigError as error:
            assert str(error).startswith(f"{path}: ")


@FUZZ
@given(valid, st.sampled_from(FIELDS), values)
def test_from_dict_takes_any_value(data, name, value):
    """The in-memory entry point (what tomllib returns, or a caller's dict) is as strict."""
    try:
        config = NodeConfig.from_dict({**data, name: value})
    except ConfigError:
        return
    if name in TABLES:  # a table becomes the library's dataclass, on the node's defaults for it
        default = getattr(NodeConfig(data_dir="d", trainer=TRAINER), name)
        assert dataclasses.asdict(getattr(config, name)) == {**dataclasses.asdict(default), **value}
        return
    assert getattr(config, name) == (tuple(value) if isinstance(value, list) else value) or name == "data_dir"


def test_transport_limits_are_a_table_checked_by_key(tmp_path):
    """The [transport_limits] table reaches p2p.transport.TransportLimits; its mistakes name
    the table and the key, like every other key of the file."""
    good = tmp_path / "good.toml"
    good.write_text(tomli_w.dumps({"data_dir": "d", "trainer": TRAINER, "transport_limits": {
        "ban_seconds": 60, "handshake_timeout": 2.5, "max_pending_connections": 8}}), encoding="utf-8")
    config = NodeConfig.from_toml(good)
    assert (config.transport_limits.ban_seconds, config.transport_limits.max_pending_connections) == (60.0, 8)
    assert NodeConfig.from_toml_bytes(config.to_toml().encode(), good) == config
    for table, words in [({"ban_second": 1}, "[transport_limits] ban_second: unknown key"),
                         ({"ban_seconds": "long"}, "transport_limits: ban_seconds"),
                         ({"ban_seconds": -1}, "transport_limits"), (7, "transport_limits: expected a table")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(tomli_w.dumps({"data_dir": "d", "trainer": TRAINER, "transport_limits": table}),
                       encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            NodeConfig.from_toml(bad)
        assert str(caught.value).startswith(f"{bad}: {words}"), caught.value


# -- one config: the libraries' configs as node.toml's tables, each default defined once ---------------

def config_classes() -> list[type]:
    """Every config dataclass a node.toml or vrl train's TOML reaches (their tables and bases),
    and the runtime configs the node builds from them."""
    seen: list[type] = []
    todo = [NodeConfig, TrainConfig, ProtocolConfig, WorkConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        todo += [base for base in cls.__mro__[1:] if dataclasses.is_dataclass(base)]
        todo += [hint for hint in typing.get_type_hints(cls).values() if dataclasses.is_dataclass(hint)]
    return seen


# Field names that two config classes each declare with a default, each for a stated reason.
SAME_NAME = {
    # Two quantities that share a word: GRPO's optimiser steps per batch (GRPOConfig) and
    # EigenTrust's power iterations (ReputationConfig).
    "iterations",
    # One set in two forms: node.toml's hex node ids (NodeConfig), decoded by the node into
    # the protocol's (ProtocolConfig); empty in both, there is no value to disagree on.
    "pretrusted",
}


def test_each_default_is_defined_once():
    """No field is declared with a default in two config classes: a class that shares another's
    fields inherits them (TrainConfig and WorkConfig from GenerationConfig, ProtocolConfig from
    ProtocolParams) or holds it as a table. A table field's defaults are its class's own, so
    the test looks at scalars only; the node's own values for a table are NODE_OVERRIDES."""
    declared: dict[str, list[str]] = {}
    for cls in config_classes():
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            own = spec.name in cls.__dict__.get("__annotations__", {})
            has_default = spec.default is not dataclasses.MISSING or spec.default_factory is not dataclasses.MISSING
            if own and has_default and not dataclasses.is_dataclass(hints[spec.name]):
                declared.setdefault(spec.name, []).append(cls.__name__)
    twice = {name: classes for name, classes in declared.items() if len(classes) > 1}
    assert set(twice) == SAME_NAME, twice


def test_the_node_differs_from_its_libraries_only_where_node_overrides_says():
    node = NodeConfig(data_dir="d", trainer=TRAINER)
    assert set(NODE_OVERRIDES) <= set(TABLES)
    for name, cls in TABLES.items():
        library, mine = dataclasses.asdict(cls()), dataclasses.asdict(getattr(node, name))
        differ = {key: mine[key] for key in library if mine[key] != library[key]}
        assert differ == NODE_OVERRIDES.get(name, {}), name


def test_the_node_keeps_the_values_it_had():
    """The values a node ran with before its settings became tables (issue 14 §2: behaviour
    stays; vrl/node/config.py says why each differs from vrl train's)."""
    node = NodeConfig(data_dir="d", trainer=TRAINER)
    assert (node.work.model, node.work.task, node.work.device, node.work.group_size, node.work.temperature,
            node.work.max_new_tokens, node.work.generation_batch) == ("base", "arithmetic:digits=2,ops=+", "auto", 8,
                                                                      1.0, 0, 32)  # 0: the task set's, 8 here
    assert (node.protocol.groups_per_round, node.protocol.verdict_wait, node.protocol.round_timeout,
            node.protocol.max_staleness, node.protocol.lazy_audit_rate, node.protocol.plant_every,
            node.protocol.last_version, node.protocol.min_batch_groups) == (4, 4.0, 60.0, 2, 0.25, 0, 0, 1)
    assert (node.train.learning_rate, node.train.warmup_steps, node.train.held_out, node.train.eval_every,
            node.train.grad_clip, node.train.keep_checkpoints) == (2e-5, 5, 128, 1, 1.0, 2)
    assert (node.admission.batch_groups, node.admission.node_cap, node.admission.trusted_share) == (12, 0.34, 0.5)
    assert node.grpo == GRPOConfig() and node.reputation == ReputationConfig()
    assert not hasattr(GRPOConfig(), "max_staleness")  # one bound: the network's ([protocol])


def test_every_table_round_trips(tmp_path):
    config = NodeConfig.from_dict({
        "data_dir": str(tmp_path / "d"), "trainer": TRAINER, "roles": ["trainer", "verifier"],
        "work": {"model": "tiny", "task": "arithmetic:digits=1", "group_size": 4, "temperature": 0.7},
        "protocol": {"groups_per_round": 2, "max_staleness": 1, "last_version": 9, "verdict_wait": 0},
        "train": {"learning_rate": 1e-4, "held_out": 16, "track_kl": False},
        "grpo": {"advantage": "mean", "aggregation": "constant", "kl_beta": 0.04, "iterations": 2},
        "reputation": {"damping": 0.2, "newcomer_checks": 3},
        "admission": {"batch_groups": 6, "trusted_share": 0},
        "transport_limits": {"ban_seconds": 5}})
    text_ = config.to_toml()
    for table in TABLES:
        assert f"\n[{table}]\n" in text_
    path = tmp_path / "node.toml"
    path.write_text(text_, encoding="utf-8")
    assert NodeConfig.from_toml(path) == config
    # The file's keys are layered on the node's defaults: what it does not say is the node's.
    assert (config.admission.node_cap, config.train.warmup_steps, config.grpo.eps_low) == (0.34, 5, 0.2)
    assert (config.protocol.verdict_wait, config.admission.trusted_share) == (0.0, 0.0)  # ints given, floats kept


def test_a_bad_value_in_a_table_names_the_file_the_table_and_the_key(tmp_path):
    path = write(tmp_path, "[grpo]\neps_low = 1.5\n")
    with pytest.raises(ConfigError) as caught:
        NodeConfig.from_toml(path)
    assert str(caught.value) == f"{path}: [grpo] eps_low: must be in (0, 1), got 1.5"
    assert isinstance(caught.value, VrlError) and isinstance(caught.value, ValueError)
    result = CliRunner().invoke(app, ["node", "--config", str(path)])
    assert result.exit_code == 2 and f"{path}: [grpo] eps_low: must be in (0, 1)" in result.output, result.output


def test_library_configs_are_checked_where_they_are_made():
    """The checks serve every config dataclass, not only node.toml's: one ConfigError type,
    naming the class and the field."""
    for make, name in [(lambda: GRPOConfig(eps_low=2.0), "GRPOConfig.eps_low"),
                       (lambda: ReputationConfig(damping=0.0), "ReputationConfig.damping"),
                       (lambda: AdmissionConfig(node_cap=0.0), "AdmissionConfig.node_cap"),
                       (lambda: ProtocolParams(max_staleness=-1), "ProtocolParams.max_staleness"),
                       (lambda: LearnerConfig(held_out=0), "LearnerConfig.held_out"),
                       (lambda: GenerationConfig(device="tpu"), "GenerationConfig.device"),
                       (lambda: TrainConfig(steps=0), "TrainConfig.steps"),
                       (lambda: TrainConfig(temperature=0.0), "TrainConfig.temperature")]:
        with pytest.raises(ConfigError, match=rf"^{re.escape(name)}: "):
            make()


def test_vrl_train_toml_keeps_its_grpo_table(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text("steps = 3\ngroup_size = 4\n[grpo]\nadvantage = 'mean'\n", encoding="utf-8")
    config = TrainConfig.from_toml(path)
    assert (config.steps, config.group_size, config.grpo.advantage, config.warmup_steps) == (3, 4, "mean", 20)
    path.write_text(config.to_toml(), encoding="utf-8")
    assert TrainConfig.from_toml(path, steps=5, grpo={"kl_beta": None}) == dataclasses.replace(config, steps=5)
    # A run's config.toml from before max_staleness left GRPO is told where it went.
    path.write_text("[grpo]\nmax_staleness = 4\n", encoding="utf-8")
    moved = rf"^{re.escape(str(path))}: \[grpo\] max_staleness: moved to the \[protocol\]"
    with pytest.raises(ConfigError, match=moved):
        TrainConfig.from_toml(path)
    # ...but a run that version wrote itself resumes: --resume reads it with from_saved.
    old_run = config.to_toml().replace("[grpo]\n", "[grpo]\nmax_staleness = 4\n")
    path.write_text(old_run, encoding="utf-8")
    assert "max_staleness" in path.read_text() and TrainConfig.from_saved(path, steps=5) == dataclasses.replace(
        config, steps=5)
    path.write_text("[grpo]\neps_low = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: \[grpo\] eps_low: must be in \(0, 1\)"):
        TrainConfig.from_toml(path)


def test_tables_nested_a_thousand_deep_are_a_config_error_not_a_recursion_error(tmp_path):
    """repr() of a 1,200-deep table where a number belongs raised RecursionError (review)."""
    path = tmp_path / "deep.toml"
    path.write_text(f'data_dir = "d"\ntrainer = "{"a" * 64}"\n[protocol.verdict_wait{".x" * 1200}]\ny = 1\n',
                    encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[protocol\] verdict_wait: expected a number"):
        NodeConfig.from_toml(path)
    path.write_text(f'[grpo.eps_low{".x" * 1200}]\ny = 1\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[grpo\] eps_low: expected a number"):
        TrainConfig.from_toml(path)


# What an error message quotes: any value, hostile ones included, in a bounded line.
ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(0, 20000).map(lambda bits: -(1 << bits)) | st.floats()
    | st.text(max_size=2000) | st.binary(max_size=2000),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=300), inner, max_size=8),
    max_leaves=40)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(ANY_VALUE)
@example("x" * 58)
@example("x" * 59)
@example(2**265)
@example([2**20000])
@example({"task": [0xF << 20000]})
def test_a_quoted_value_is_one_short_line_whatever_it_is(value):
    text = shown(value)
    assert isinstance(text, str) and len(text) <= MAX_SHOWN + 30
    if isinstance(value, int) and value.bit_length() > 256:
        assert text == f"an integer of {value.bit_length()} bits"  # repr refuses past 4,300 digits
    elif not isinstance(value, (list, dict)) and len(repr(value)) <= 60:
        assert text == repr(value)  # a short value is quoted whole (reprlib's maxstring, 60)


def test_a_deeply_nested_or_huge_value_is_quoted_short():
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    assert len(shown(nested)) <= MAX_SHOWN and shown(10**5000) == "an integer of 16610 bits"
