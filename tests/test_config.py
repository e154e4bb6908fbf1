"""node.toml: every key checked for its type, its range and its spelling, at the boundary.

A user mistake is one line naming the file and the key, never a traceback; hostile files
(huge, NaN, wrong types, nested tables, raw bytes) end as a config or a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vrl.cli import app
from vrl.rollouts.keys import NodeKey
from p2p.transport import TransportLimits
from vrl.node.config import ConfigError, NodeConfig

TRAINER = NodeKey.from_seed(b"trainer".ljust(32, b"\0")).node_id.hex()
PEER = "12D3KooWNhcdA7EGHAEDzWqyqASp2ZjzzjVFzx2q5rchwgEYtFVj"  # an Ed25519 libp2p peer id (multiaddr_for)
REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'data_dir = "d"\ntrainer = "{TRAINER}"\n' + text, encoding="utf-8")
    return path


# Each is a mistake a user makes, and the key the one-line error must name.
MISTAKES = {
    'group_size = "eight"': "group_size",
    "group_size = -4": "group_size",
    "group_size = 4.5": "group_size",
    "group_size = true": "group_size",
    "group_size = 100000": "group_size",
    "metrics_port = 99999": "metrics_port",
    "metrics_port = -1": "metrics_port",
    'listen = "/ip4/127.0.0.1/tcp/99999"': "listen",
    'listen = "/ip4/300.0.0.1/tcp/4001"': "listen",
    'listen = "127.0.0.1:4001"': "listen",
    f'bootstrap = ["/ip4/127.0.0.1/tcp/99999/p2p/{PEER}"]': "bootstrap",
    'bootstrap = ["/ip4/127.0.0.1/tcp/4001/p2p/QmNotAnEd25519Id"]': "bootstrap",
    'bootstrap = ["/ip4/127.0.0.1/tcp/4001"]': "bootstrap",
    f'bootstrap = "/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"': "bootstrap",
    'pretrusted = ["abcd"]': "pretrusted",
    f'pretrusted = ["{TRAINER[:62]} {TRAINER[62:]}"]': "pretrusted",  # bytes.fromhex would skip the space
    "temperature = nan": "temperature",
    "temperature = inf": "temperature",
    "temperature = 0.0": "temperature",
    "temperature = 1e400": "temperature",
    "node_cap = 1.5": "node_cap",
    "trusted_share = -0.1": "trusted_share",
    "lazy_audit_rate = 2": "lazy_audit_rate",
    "verdict_wait = -1": "verdict_wait",
    "round_timeout = 0": "round_timeout",
    "max_staleness = 1000": "max_staleness",
    "learning_rate = 0": "learning_rate",
    "torch_threads = 0": "torch_threads",
    "torch_threads = 10000000": "torch_threads",
    "rounds = 18446744073709551616": "rounds",
    "held_out = 0": "held_out",
    'roles = ["miner"]': "roles",
    "roles = []": "roles",
    'roles = ["worker", "worker"]': "roles",
    'device = "tpu"': "device",
    'device = "cuda:x"': "device",
    'adversary = "bribery"': "adversary",
    'transport = "carrier-pigeon"': "transport",
    'task = "arithmetic:digits=0"': "task",
    'task = ""': "task",
    'model = ""': "model",
    'key = ""': "key",
    'key = "a\\u0000b"': "key",
    "max_new_tokens = 0": "max_new_tokens",
    "max_new_tokens = 2000000": "max_new_tokens",
    "groups_per_round = 0": "groups_per_round",
    "batch_groups = {a = 1}": "batch_groups",
    "eval_every = 2024-01-01": "eval_every",
    "port = 4001": "port",
    "group_sise = 8": "group_sise",
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
    with pytest.raises(ConfigError, match="^group_size: must be in .*an integer of 16610 bits"):
        NodeConfig.from_dict({"data_dir": "d", "trainer": TRAINER, "group_size": 10**5000})


def test_unknown_key_suggests_the_known_one(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'rols'.*did you mean 'roles'"):
        NodeConfig.from_toml(write(tmp_path, "rols = []\n"))


def test_values_are_normalized_and_relative_paths_are_resolved_once(tmp_path):
    path = write(tmp_path, "temperature = 1\n"
                 f'bootstrap = ["/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"]\ndevice = "cuda:1"\n')
    config = NodeConfig.from_toml(path)
    assert config.temperature == 1.0 and isinstance(config.temperature, float)
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
    path = write(tmp_path, 'group_size = "eight"\nmodel = "no-such-model"\n')
    result = CliRunner().invoke(app, ["node", "--config", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "group_size" in lines[0], result.output
    assert "Traceback" not in result.output


def test_vrl_node_prints_one_line_when_the_model_cannot_be_loaded(tmp_path):
    """Errors only the start finds (here: no such model) are one line too, naming file and key,
    and the process exits (the transport it had started is closed)."""
    path = write(tmp_path, 'model = "no-such-model"\ntransport = "libp2p"\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "vrl.cli", "node", "--config", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and str(path) in error[0] and "model: " in error[0], done.stderr


def test_start_checks_name_the_key(tmp_path):
    from vrl.node.run import preflight

    with pytest.raises(ConfigError, match="^task: "):
        preflight(NodeConfig(data_dir=str(tmp_path), trainer=TRAINER, task=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ConfigError, match="^device: "):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA; the check needs a device it lacks")
        preflight(NodeConfig(data_dir=str(tmp_path), trainer=TRAINER, device="cuda"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="^data_dir: "):
        preflight(NodeConfig(data_dir=str(tmp_path / "file"), trainer=TRAINER))


# -- properties ---------------------------------------------------------------------------------

FIELDS = [f.name for f in dataclasses.fields(NodeConfig)]
toml_int = st.integers(-2**63, 2**63 - 1)  # TOML's integers are 64-bit
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.booleans(), toml_int, st.integers(), st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
    text, st.datetimes(), st.dates(), st.sampled_from(["", "\x00", "auto", "cuda:99", "loopback/" + TRAINER]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)
valid = st.fixed_dictionaries({"data_dir": st.just("d"), "trainer": st.just(TRAINER)}, optional={
    "group_size": st.integers(2, 1024), "temperature": st.floats(0.01, 10), "metrics_port": st.integers(0, 65535),
    "roles": st.lists(st.sampled_from(["worker", "verifier", "trainer"]), min_size=1, max_size=3, unique=True),
    "listen": st.builds("/ip4/127.0.0.1/tcp/{}".format, st.integers(0, 65535)),
    "bootstrap": st.lists(st.builds(f"/ip4/10.0.0.1/tcp/{{}}/p2p/{PEER}".format, st.integers(1, 65535)), max_size=3),
    "device": st.sampled_from(["auto", "cpu", "cuda", "cuda:0", "cuda:7"]),
    "node_cap": st.floats(0.01, 1.0), "max_staleness": st.integers(0, 16), "torch_threads": st.integers(1, 64)})
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
    if name == "transport_limits":  # a table becomes the library's dataclass
        assert dataclasses.asdict(config.transport_limits) == {**dataclasses.asdict(TransportLimits()), **value}
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
    for table, words in [({"ban_second": 1}, "transport_limits.ban_second: unknown key"),
                         ({"ban_seconds": "long"}, "transport_limits: ban_seconds"),
                         ({"ban_seconds": -1}, "transport_limits"), (7, "transport_limits: expected a table")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(tomli_w.dumps({"data_dir": "d", "trainer": TRAINER, "transport_limits": table}), encoding="utf-8")
        with pytest.raises(ConfigError, match=f"^{bad}: {words}"):
            NodeConfig.from_toml(bad)
