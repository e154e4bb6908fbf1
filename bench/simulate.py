"""The protocol at scale, simulated: N real NodeProtocol state machines on a simulated clock and
network (vrl.harness.simulator; what is modelled and what is stubbed is said there). One run, or
a named scenario of runs:

    python bench/simulate.py --nodes 100 --rounds 20 --adversaries collude:0.3,lazy:0.1
    python bench/simulate.py --nodes 10 --rounds 5 --json                  # one JSON object
    python bench/simulate.py --compare bench/results/devnet-costs.json      # N = 5 and 12 beside the devnet
    python bench/simulate.py --sweep 10,100,1000 --rounds 20 --out bench/results/simulate-tickets.json
    python bench/simulate.py adversaries --out FILE   # every adversary family at 10%, 30% and 45%
    python bench/simulate.py liar --out FILE          # liars against the trainer's loss-confirmation budget
    python bench/simulate.py withhold --out FILE      # withholding, a flood of fresh keys, churn
    python bench/simulate.py memory --out FILE        # what the protocols keep over a run
    python bench/simulate.py table --out FILE COMMAND=PATH ...   # --json runs as one per-node table
    python bench/simulate.py wide --out DIR           # N = 1,000 on a machine of many cores

``python bench/simulate.py SCENARIO --help`` says what a scenario runs and writes.

One run's figures, per node and per round (means over nodes and the measured rounds, after
--warmup rounds): checks, verify-seconds, bytes in and out, messages; rounds from a cheater's
first bad group to its quarantine; honest false quarantines; bad groups trained; groups lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from enum import StrEnum
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vrl.config import ConfigError  # noqa: E402
from vrl.harness.simulator import ALL_ADVERSARIES, SimConfig, Simulation, SpecError, parse_adversaries  # noqa: E402
from vrl.harness.simulator.spec import BACKFILL_MODELS  # noqa: E402
from vrl.node.params import ProtocolParams, Verification  # noqa: E402

console = Console(stderr=True)
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# What the calibration compares: issue 30 asks for agreement within 20% with the real devnet.
COMPARED = ("checks_per_round", "bytes_per_round", "bytes_per_round_without_blobs", "messages_per_round")
TOLERANCE = 0.20


# -- flag values: each a value or a one-line argparse error naming the flag --------------------------

def batch_groups_arg(text: str) -> str:
    """--batch-groups: 'round', or a whole number of groups from 1 (argparse names the flag on error)."""
    # isdigit() alone takes '¹' and other Unicode digits, which int() refuses (found by tests/test_bench_flags.py).
    if text in ("", "round") or (text.isascii() and text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"'round' or a whole number of groups >= 1, got {text!r}")


def tokens_arg(text: str) -> float:
    """--completion-tokens: a finite mean of at least 1 (argparse names the flag on error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1 <= value <= 2**16):
        raise argparse.ArgumentTypeError(f"a mean number of tokens in [1, 65536], got {text!r}")
    return value


def jobs_arg(text: str) -> int:
    """--jobs: a whole number of processes from 1."""
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 1024):  # isdigit() alone takes '¹'
        raise argparse.ArgumentTypeError(f"a whole number of processes in [1, 1024], got {text!r}")
    return int(text)


def protocol_arg(text: str) -> tuple[str, float | int | str]:
    """--protocol KEY=VALUE: a ProtocolParams field and a value of its default's type (argparse
    names the flag on error; ProtocolConfig checks the range when the simulation starts)."""
    key, _, value = text.partition("=")
    defaults = {f.name: f.default for f in dataclasses.fields(ProtocolParams)}
    if key not in defaults or not value:
        raise argparse.ArgumentTypeError(f"KEY=VALUE with KEY one of ProtocolParams' fields, got {text!r}")
    kind = type(defaults[key])
    if issubclass(kind, StrEnum) and value not in {m.value for m in kind}:  # verification
        raise argparse.ArgumentTypeError(f"{key}: one of {', '.join(kind)}, got {value!r}")
    try:
        return key, kind(value) if kind in (int, float, str) or issubclass(kind, StrEnum) else value
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: not a {kind.__name__}: {value!r}") from None


def shares_arg(text: str) -> list[float]:
    """``--shares``: comma-separated shares of the nodes in [0, 1) (0: a run with no adversary)."""
    try:
        shares = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated numbers in [0, 1), got {text!r}") from None
    if not all(0 <= share < 1 for share in shares):  # NaN fails this too
        raise argparse.ArgumentTypeError(f"each share must be in [0, 1), got {text!r}")
    return shares


def budgets_arg(text: str) -> list[int]:
    """``--budgets``: comma-separated loss_claim_budget values (0: no budget)."""
    try:
        budgets = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated whole numbers, got {text!r}") from None
    if not all(0 <= budget <= 2**16 for budget in budgets):
        raise argparse.ArgumentTypeError(f"each budget must be in [0, 65536] (ProtocolParams), got {text!r}")
    return budgets


def counts_arg(text: str) -> list[int]:
    """``--nodes 11,50`` or ``--sweep 10,100,1000``: comma-separated node counts of at least 3."""
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() and int(p) >= 3 for p in parts):
        raise argparse.ArgumentTypeError(f"comma-separated node counts >= 3, got {text!r}")
    return [int(p) for p in parts]


# The options several scenarios take, each given its default by the scenario that takes it
# (:func:`options`): the flag's type and help.
OPTIONS = {
    "nodes": (int, "nodes, the trainer (node 0) among them"),
    "rounds": (int, "rounds measured"),
    "warmup": (int, "rounds run before the measured ones"),
    "design": (Verification, "the verification design ProtocolParams selects"),
    "seed": (int, "the simulation's seed"),
    "batch_groups": (batch_groups_arg, "groups a step trains on: a number, or 'round' (every worker's round); "
                                       "'': node.toml's (vrl.node.config.NODE_OVERRIDES)"),
    "completion_tokens": (tokens_arg, "mean completion tokens a record (default: the devnet's base model's, 4)"),
    "cpu_limit": (float, "stop a run after this many CPU seconds"),
    "out": (Path, "write the JSON here"),
}
REQUIRED = object()


def options(parser: argparse.ArgumentParser, **defaults) -> None:
    """Add the shared :data:`OPTIONS` named, each with the default given (:data:`REQUIRED`: a
    flag that must be given); ``protocol=True`` adds the repeatable ``--protocol KEY=VALUE``."""
    for name, default in defaults.items():
        if name == "protocol":
            parser.add_argument("--protocol", type=protocol_arg, action="append", default=[], metavar="KEY=VALUE",
                                help="a protocol parameter (vrl.node.params.ProtocolParams), e.g. "
                                     "submission_window=120")
            continue
        kind, help_ = OPTIONS[name]
        flag = "--" + name.replace("_", "-")
        if default is REQUIRED:
            parser.add_argument(flag, type=kind, required=True, help=help_)
        else:
            parser.add_argument(flag, type=kind, default=default, help=help_)


def batch_size(batch_groups: str, nodes: int) -> int | None:
    """The groups a step trains on for --batch-groups at ``nodes``: 'round' is every worker's round
    (bench/devnet.py costs' "paced" mode: the trainer steps on the round's decided groups, or at
    round_timeout, as a network of N workers would); '' is node.toml's default (None)."""
    if batch_groups == "round":
        return ProtocolParams().groups_per_round * (nodes - 1)
    return int(batch_groups) if batch_groups else None


def admission(batch: int | None) -> dict:
    """SimConfig.admission for a batch of ``batch`` groups (None: node.toml's)."""
    return {} if batch is None else {"batch_groups": batch}


def tokens_from(completion_tokens: float | None) -> dict:
    """SimConfig's token settings for ``--completion-tokens``: that mean, and room for twice it."""
    if completion_tokens is None:
        return {}
    return {"completion_tokens": completion_tokens,
            "max_new_tokens": max(SimConfig.max_new_tokens, math.ceil(2 * completion_tokens))}


def invocation(args: argparse.Namespace) -> str:
    """The command that ran: ``python bench/simulate.py [SCENARIO] ARGS``."""
    return " ".join(["python bench/simulate.py", *([args.scenario] if args.scenario else []), *args.argv])


def what(runner) -> str:
    """A scenario's first paragraph, on one line: what its results file says it holds."""
    return inspect.cleandoc(runner.__doc__).split("\n\n")[0].replace("\n", " ")


def machine(jobs: str) -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {jobs}"


def write(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")


# -- one run, a sweep of N, or the simulator beside the real devnet (no scenario named) ---------------

def one_options(parser: argparse.ArgumentParser) -> None:
    options(parser, nodes=10, rounds=5, warmup=1)
    parser.add_argument("--adversaries", default="",
                        help=f"kind:share,... of {', '.join(sorted(ALL_ADVERSARIES))}")
    options(parser, design=ProtocolParams.verification, seed=0)  # the node's default
    parser.add_argument("--latency-ms", type=float, default=1.0, help="one-way latency per hop")
    parser.add_argument("--bandwidth-mbps", type=float, default=100.0, help="per link")
    parser.add_argument("--loss", type=float, default=0.0, help="share of gossip deliveries missed (backfilled)")
    parser.add_argument("--partition", default="", help="FROM:UNTIL:SHARE versions and share of nodes cut off")
    parser.add_argument("--churn", type=float, default=0.0, help="share of nodes that leave for a round per version")
    parser.add_argument("--joins", type=int, default=0, help="fresh honest nodes joining per version")
    options(parser, batch_groups="", completion_tokens=None, protocol=True)
    parser.add_argument("--topology", default="devnet", choices=("devnet", "random"))
    parser.add_argument("--makers", type=int, default=1,
                        help="processes that make workers' groups ahead, on the machine's other cores "
                             "(0: none; the results are the same, vrl.harness.simulator.making)")
    parser.add_argument("--cores", type=int, default=0,
                        help="processors all nodes share, as a devnet on one machine (0: one each)")
    parser.add_argument("--backfill", choices=BACKFILL_MODELS, default=None,
                        help="a backfill pass's cost: what the network gossiped (the committee design's target), "
                             "or each peer's store as the daemon pages it (default: daemon with --compare, else "
                             "gossip); both by cursor kept across rounds (what a peer stored since the last pass), "
                             "'-round': the cursor kept within a round only (the first pass of each round pages the "
                             "window whole), '-full': every pass the whole window, as before cursors "
                             "(specs/network.md §6)")
    parser.add_argument("--cost", type=Path, default=None, help="bench/cost.py results (default small float32)")
    parser.add_argument("--wall-limit", type=float, default=None, help="stop after this many wall seconds")
    options(parser, cpu_limit=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--compare", type=Path, default=None, help="bench/results/devnet-costs.json")
    parser.add_argument("--runs", default="", help="with --compare: indices of the file's runs to compare, e.g. 5,6 "
                                                    "(default: every run that finished)")
    parser.add_argument("--note", default="", help="with --compare: a note kept in the output (what the runs show)")
    parser.add_argument("--sweep", type=counts_arg, default=None,
                        help="node counts to run one after another, e.g. 10,100,1000")
    options(parser, out=None)


def one(args: argparse.Namespace) -> int:
    if args.compare:
        result = compare(args)
    elif args.sweep:
        result = {"runs": [run(config_from(args, n), args.wall_limit, args.cpu_limit) for n in args.sweep]}
        for summary in result["runs"]:
            show(summary)
    else:
        result = run(config_from(args), args.wall_limit, args.cpu_limit)
        show(result)
    text = json.dumps(result, indent=1, sort_keys=True, default=str)
    if args.out:
        args.out.write_text(text + "\n")
        console.print(f"wrote {args.out}")
    if args.json:
        print(text)
    return 0


def config_from(args: argparse.Namespace, nodes: int | None = None) -> SimConfig:
    partition = None
    if args.partition:
        start, end, share = args.partition.split(":")
        partition = (int(start), int(end), float(share))
    nodes = nodes or args.nodes
    return SimConfig(nodes=nodes, rounds=args.rounds, adversaries=parse_adversaries(args.adversaries),
                     seed=args.seed, design=args.design, warmup=args.warmup, latency_s=args.latency_ms / 1000,
                     bandwidth_bps=args.bandwidth_mbps * 1e6 / 8, loss=args.loss, partition=partition,
                     churn=args.churn, joins=args.joins, topology=args.topology, cores=args.cores, makers=args.makers,
                     admission=admission(batch_size(args.batch_groups, nodes)),
                     protocol=dict(args.protocol),
                     backfill=args.backfill or ("daemon" if args.compare else "gossip"),
                     **({"cost_file": args.cost} if args.cost else {}), **tokens_from(args.completion_tokens))


def run(config: SimConfig, wall_limit: float | None, cpu_limit: float | None = None) -> dict:
    started = time.perf_counter()
    summary = Simulation(config).run(wall_limit, cpu_limit).summary
    console.print(f"[dim]{config.nodes} nodes, {config.design}: {summary['rounds_measured']} rounds measured in "
                  f"{time.perf_counter() - started:.1f} s wall, {summary['cpu_seconds']:.1f} s CPU "
                  f"({summary['stopped']})[/]")
    return summary


def show(summary: dict) -> None:
    table = Table(title=f"{summary['nodes']} nodes, {summary['design']}, {summary['rounds_measured']} rounds measured "
                        f"({summary['stopped']}; {summary['wall_seconds']:.0f} s wall, "
                        f"{summary['cpu_seconds']:.0f} s CPU)")
    for column in ("who", "checks/round", "verify s/round", "bytes in/round", "bytes out/round", "blob bytes",
                   "messages/round"):
        table.add_column(column, justify="right")
    for who, key in (("mean node", "per_node"), ("trainer", "per_node_trainer"), ("other nodes", "per_node_others")):
        row = summary.get(key) or {}
        if row:
            table.add_row(who, f"{row['checks_per_round']:.2f}", f"{row['verify_seconds_per_round']:.2f}",
                          f"{row['bytes_in']:,.0f}", f"{row['bytes_out']:,.0f}", f"{row['blob_bytes']:,.0f}",
                          f"{row['messages_per_round']:.0f}")
    console.print(table)
    rq = Table(title="adversaries: rounds from first cheat to quarantine")
    for column in ("kind", "nodes", "cheated", "quarantined (trainer)", "median rounds (trainer)",
                   "median rounds (median honest node)"):
        rq.add_column(column, justify="right")
    for kind, row in summary["rounds_to_quarantine"].items():
        rq.add_row(kind, str(row["nodes"]), str(row["cheated"]), str(row["quarantined_by_trainer"]),
                   str(row["median_rounds_trainer"]), str(row["median_rounds_median_honest"]))
    if summary["rounds_to_quarantine"]:
        console.print(rq)
    console.print(f"honest false quarantines: {summary['honest_false_quarantines']}   bad groups trained: "
                  f"{summary['bad_groups_trained']} {summary['bad_groups_trained_by_kind'] or ''}   groups lost: "
                  f"{summary['groups_lost']} of {summary['honest_groups_published']} (pending at the stop: "
                  f"{summary['groups_pending']})   withheld: "
                  f"{summary['withheld_groups']}")
    if summary["trainer_conviction"]:
        console.print(f"trainer conviction: {summary['trainer_conviction']}")
    if summary["sybil"]["keys"]:
        console.print(f"sybil flood: {summary['sybil']}; honest verdicts the trainer did not count: "
                      f"{summary['honest_verdicts_not_counted_by_trainer']}")
    if summary["unhandled"]:
        console.print(f"[yellow]actions or topics this driver does not know: {summary['unhandled']}[/]")


def run_settings(settings: dict, run_: dict) -> dict:
    """SimConfig fields of one devnet run (bench/devnet.py costs): its design, its node.toml
    overrides ([protocol] and [admission], the paced mode's batch included), the group's shape
    and the tokens its records carried (read from the trainer's store), and the weights' size."""
    overrides = run_.get("overrides", {})
    tables = run_.get("tables") or settings.get("tables", {})
    protocol = {k: v for k, v in overrides.get("protocol", {}).items() if k != "verification"}
    out = {"design": run_.get("design", Verification.TICKETS), "protocol": protocol,  # (runs before --designs)
           "admission": dict(run_.get("admission_overrides") or {}),
           "group_size": int(tables.get("work", {}).get("group_size") or settings.get("group_size") or 8)}
    if run_.get("max_new_tokens"):
        out["max_new_tokens"] = int(run_["max_new_tokens"])
    if run_.get("mean_prompt_tokens"):
        out["prompt_tokens"] = float(run_["mean_prompt_tokens"])
    if run_.get("mean_completion_tokens"):
        out["completion_tokens"] = float(run_["mean_completion_tokens"])
    if run_.get("mean_commitment_bytes"):
        out["commitment_bytes"] = round(run_["mean_commitment_bytes"])
    if run_.get("mean_task_id_chars"):
        out["task_id_chars"] = round(run_["mean_task_id_chars"])
    for name in ("weights_bytes", "optimizer_bytes", "delta_bytes"):
        if run_.get(name):
            out[name] = int(run_[name])
    return out


def compare(args: argparse.Namespace) -> dict:
    """The simulator beside the real devnet (bench/devnet.py costs' results) at each N it ran,
    with each run's settings (:func:`run_settings`); runs that failed are skipped."""
    try:
        real = json.loads(Path(args.compare).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"{args.compare}: cannot read the devnet's costs ({error})") from None
    out = []
    chosen = {int(i) for i in args.runs.split(",")} if args.runs else None
    for index, run_ in enumerate(real.get("runs", [])):
        if "per_node" not in run_ or (chosen is not None and index not in chosen):
            continue
        nodes, rounds = int(run_["nodes"]), int(run_["rounds"])
        settings = real.get("settings", {})
        config = config_from(args, nodes)
        config = dataclasses.replace(config, rounds=rounds, warmup=int(settings.get("warmup_versions", 1)),
                                     **run_settings(settings, run_))
        sim = run(config, args.wall_limit, args.cpu_limit)
        sim_seconds = (sim["per_round"] and sum(r["seconds"] for r in sim["per_round"][config.warmup:])
                       / max(1, len(sim["per_round"][config.warmup:])))
        table = Table(title=f"N = {nodes}, {config.design}, {run_.get('mode', '')}: simulator vs real devnet "
                            f"({rounds} rounds; seconds a round: simulated {sim_seconds:.1f}, devnet "
                            f"{run_.get('seconds_per_round', 0):.1f})")
        for column in ("metric", "who", "simulated", "devnet", "sim / real", f"within {TOLERANCE:.0%}"):
            table.add_column(column, justify="right")
        rows = []
        for who, sim_key, real_key in (("mean node", "per_node", "per_node"), ("trainer", "per_node_trainer",
                                                                                "per_node_trainer"),
                                       ("workers", "per_node_others", "per_node_workers")):
            for metric in COMPARED:
                s, r = sim.get(sim_key, {}).get(metric), run_.get(real_key, {}).get(metric)
                if s is None or r is None:
                    continue
                ratio = s / r if r else float("inf")
                ok = abs(ratio - 1) <= TOLERANCE
                rows.append({"nodes": nodes, "who": who, "metric": metric, "simulated": s, "devnet": r,
                             "ratio": ratio, "within": ok})
                table.add_row(metric, who, f"{s:,.2f}", f"{r:,.2f}", f"{ratio:.2f}", "yes" if ok else "[red]no[/]")
        console.print(table)
        out.append({"run": index, "nodes": nodes, "design": config.design, "mode": run_.get("mode"),
                    "overrides": run_.get("overrides", {}), "admission": config.admission,
                    "backfill_model": config.backfill,
                    "seconds_per_round": {"simulated": sim_seconds, "devnet": run_.get("seconds_per_round")},
                    "groups_per_round": {"simulated": _groups_per_round(sim),
                                         "devnet": run_.get("network", {}).get("groups_published_per_round")},
                    # Mean node: a backfill pass runs every 5 s (a timer), so these grow with a round's seconds.
                    "backfill_bytes_per_round": {
                        "simulated": sim.get("per_node", {}).get("backfill_bytes"),
                        "devnet": run_.get("per_node", {}).get("backfill_bytes_per_round")},
                    # Network-wide: each replay fetches two optimizer states (2 x ~1.9 x the
                    # weights), a Bernoulli(step_audit_rate) draw per verifier and step on both sides.
                    "step_replays_per_round": {
                        "simulated": sim.get("per_node", {}).get("step_replays_per_round", 0.0) * nodes,
                        "devnet": (sum(r.get("step_replays_per_round", 0.0) for r in run_.get("per_node_detail", []))
                                   if any("step_replays_per_round" in r for r in run_.get("per_node_detail", []))
                                   else None)},
                    "rows": rows, "simulated": sim})
    return {"compare": str(args.compare), "notes": args.note,
            "runs_compared": sorted(chosen) if chosen is not None else "all",
            # The hash seed is recorded: before vrl.node.scans.Scan.candidates broke ties by digest,
            # committee-design runs differed between processes (an order followed a set of bytes).
            "command": f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '(random)')} {invocation(args)}",
            "tolerance": TOLERANCE, "runs": out}


def _groups_per_round(sim: dict) -> float:
    """Groups the workers published a measured round, network-wide (the devnet's
    network.groups_published_per_round counts rollouts made / group_size)."""
    measured = sim.get("rounds_measured") or 0
    return sim.get("honest_groups_published", 0) / measured if measured else 0.0


# -- adversaries: every family at each share ---------------------------------------------------------

CONTENT = ("quantized-model", "other-model", "tampered-tokens", "replay", "spoof-int8")
FAMILIES = ("content", "fabricated-reward", "collude", "lazy", "withhold", "sybil", "spoof", "accuse")
ADVERSARY_KEPT = ("adversaries", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds", "simulated_seconds",
                  "rounds_to_quarantine", "honest_false_quarantines", "bad_groups_trained",
                  "bad_groups_trained_by_kind", "trained_by_kind", "groups_lost", "groups_pending",
                  "rounds_never_closed", "honest_groups_published", "withheld_groups", "withholding", "sybil",
                  "per_node_others")


def adversaries_options(parser: argparse.ArgumentParser) -> None:
    options(parser, nodes=100, rounds=12, warmup=1, design=Verification.COMMITTEE)
    parser.add_argument("--shares", default="0.1,0.3,0.45", type=shares_arg, help="each family's shares of the nodes")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"of {', '.join(FAMILIES)}")
    options(parser, batch_groups="round", cpu_limit=None, seed=0, completion_tokens=None)
    parser.add_argument("--jobs", type=jobs_arg, default=1, help="runs at once, one process each")
    options(parser, protocol=True, out=REQUIRED)


def family_spec(family: str, share: float) -> str:
    if family == "content":
        return ",".join(f"{kind}:{share / len(CONTENT):.4f}" for kind in CONTENT)
    if family == "spoof":
        return f"spoof-int8:{share}"
    return f"{family}:{share}"


def kept_run(config: SimConfig, cpu_limit: float | None) -> tuple[dict, float]:
    """One run (in a worker process under --jobs): its kept summary and its wall seconds."""
    started = time.perf_counter()
    summary = Simulation(config).run(cpu_limit_s=cpu_limit).summary
    return {key: summary.get(key) for key in ADVERSARY_KEPT}, time.perf_counter() - started


def adversaries(args: argparse.Namespace) -> int:
    """Every adversary at 10%, 30% and 45% of the nodes, simulated (issue 30's "rounds to
    quarantine for every adversary"): the real NodeProtocol state machines of vrl.harness.simulator,
    one run per adversary family and share, each with the same seed and settings.

    Families (each run holds one; the devnet's content cheats share their family's nodes equally):

    * ``content``: the devnet's cheats on a group's content (quantized-model, other-model,
      tampered-tokens, replay, spoof-int8), each a fifth of the share;
    * ``fabricated-reward``, ``collude`` (workers that fabricate rewards and, as verifiers, pass each
      other's bad groups), ``lazy`` (verifiers that pass without checking), ``withhold`` (workers
      that submit half their assigned groups), ``sybil`` (a flood of fresh keys each round),
      ``accuse`` (members that hard-fail honest groups);
    * ``spoof``: spoof-int8 at the whole share, the cheat only the sequential tests see; how fast
      they see it is the spoofer's token count (``--completion-tokens``, specs/verification.md §7.1).

    For each run: rounds from a cheater's first bad group to its quarantine by the trainer (median
    over the cheaters it quarantined, and how many), honest false quarantines (must be 0), bad
    groups trained (must be 0 below the bound f* of specs/committee.md §5), groups lost.

        python bench/simulate.py adversaries --nodes 100 --rounds 12 --batch-groups round \\
            --out bench/results/simulate-adversaries-committee.json
        python bench/simulate.py adversaries --nodes 100 --rounds 30 --families spoof --jobs 2 \\
            --out bench/results/simulate-adversaries-spoof.json

    Runs are independent: ``--jobs J`` runs J at once, one process each.
    """
    from vrl.node.committee import EPSILON, F_STAR

    batch = batch_size(args.batch_groups, args.nodes)
    out = {"what": what(adversaries), "command": invocation(args),
           "machine": machine(f"{args.jobs} runs at once; cpu_seconds is each run's own"),
           "f_bound": f"specs/committee.md §5: f* = {F_STAR} of verifier weight, eps = {EPSILON}",
           "settings": {"nodes": args.nodes, "rounds": args.rounds, "warmup": args.warmup, "design": args.design,
                        "batch_groups": batch, "seed": args.seed, "completion_tokens": args.completion_tokens
                        or SimConfig.completion_tokens, "protocol": dict(args.protocol)},
           "runs": {}}
    table = Table(title=f"N = {args.nodes}, {args.design}: rounds from first bad group to the trainer's quarantine")
    for column in ("adversary", "share", "cheaters", "quarantined", "median rounds", "weight at the end",
                   "false quarantines", "bad trained", "groups lost", "CPU s"):
        table.add_column(column, justify="right")
    runs = [(family, share, SimConfig(nodes=args.nodes, rounds=args.rounds, warmup=args.warmup, design=args.design,
                                      seed=args.seed, adversaries=parse_adversaries(family_spec(family, share)),
                                      admission=admission(batch), protocol=dict(args.protocol),
                                      **tokens_from(args.completion_tokens)))
            for family in args.families.split(",") for share in args.shares]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(kept_run, config, args.cpu_limit) for _, _, config in runs]
        for (family, share, _), future in zip(runs, futures):
            run_, wall = future.result()
            run_["spec"] = family_spec(family, share)
            out["runs"][f"{family}:{share}"] = run_
            quarantine = run_["rounds_to_quarantine"] or {}
            cheaters = sum(r["nodes"] for r in quarantine.values())
            caught = sum(r["quarantined_by_trainer"] for r in quarantine.values())
            medians = ", ".join(f"{k} {r['median_rounds_trainer']}" for k, r in quarantine.items())
            # Their share of the last manifest's draw weight: the f of specs/committee.md §5.
            weight = sum(r.get("weight_share", 0.0) for r in quarantine.values())
            table.add_row(family, f"{share:.0%}", str(cheaters), str(caught), medians or "-", f"{weight:.2f}",
                          str(run_["honest_false_quarantines"]), str(run_["bad_groups_trained"]),
                          str(run_["groups_lost"]), f"{run_['cpu_seconds']:.0f}")
            console.print(f"[dim]{family} {share:.0%}: {run_['rounds_measured']} rounds, {run_['stopped']}, "
                          f"{wall:.0f} s wall[/]")
            write(args.out, out)
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


# -- liar: members that state lost races, against the trainer's loss-confirmation budget --------------

def liar_options(parser: argparse.ArgumentParser) -> None:
    options(parser, nodes=100, rounds=6, warmup=1)
    parser.add_argument("--shares", default="0,0.1", type=shares_arg,
                        help="liars' shares of the nodes, comma-separated (0: none)")
    parser.add_argument("--budgets", default=f"{ProtocolParams.loss_claim_budget},0", type=budgets_arg,
                        help="loss_claim_budget values to run side by side (0: no budget)")
    options(parser, batch_groups="round", seed=0, protocol=True, out=REQUIRED)


def liar(args: argparse.Namespace) -> int:
    """The trainer's loss-confirmation budget against liars, simulated (specs/committee.md §8 "Lost
    races"; vrl/node/claims.py): members that check honestly but state every race lost on each
    committee seat they pass (the simulator's ``liar`` adversary), run side by side with the budget
    (``loss_claim_budget``, the default) and without it (0), the same seed and settings otherwise.

        python bench/simulate.py liar --nodes 100 --rounds 6 --shares 0,0.1,0.3 \\
            --out bench/results/simulate-liar-budget.json

    Per run: the trainer's checks per round (mean over the measured rounds, and each round's), its
    rounds' lengths, how many liars the trainer quarantined, honest false quarantines, and the
    checks the liars' claims asked for (``liar_charges``: the trainer's checks of groups on which a
    liar, and no one else, stated lost races, counted as the protocol asks for them).
    """
    batch = batch_size(args.batch_groups, args.nodes)
    out = {"what": what(liar), "command": invocation(args),
           "machine": machine("shared with other jobs; one run at a time"),
           "seats_per_member_per_round": "~k x groups_per_round x N_w / N_v (specs/committee.md §6)",
           "settings": {"nodes": args.nodes, "rounds": args.rounds, "warmup": args.warmup, "batch_groups": batch,
                        "seed": args.seed, "design": Verification.COMMITTEE, "protocol": dict(args.protocol)},
           "runs": {}}
    table = Table(title=f"N = {args.nodes}, committee design: liars against the trainer's loss confirmations")
    for column in ("liars", "budget", "trainer checks/round", "charged to liars", "liars quarantined",
                   "false quarantines", "CPU s"):
        table.add_column(column, justify="right")
    for share in args.shares:
        for budget in args.budgets:
            config = SimConfig(nodes=args.nodes, rounds=args.rounds, warmup=args.warmup, design=Verification.COMMITTEE,
                               seed=args.seed, adversaries=parse_adversaries(f"liar:{share}" if share else ""),
                               admission=admission(batch),
                               protocol={**dict(args.protocol), "loss_claim_budget": budget})
            run_ = liar_run(config)
            out["runs"][f"liar:{share}/budget:{budget}"] = run_
            table.add_row(f"{share:.0%}", str(budget) if budget else "none",
                          f"{run_['trainer_checks_per_round']:.1f}", str(run_["loss_confirmations_charged"]["liar"]),
                          f"{run_['liars_quarantined_by_trainer']} of {run_['liars']}",
                          str(run_["honest_false_quarantines"]), f"{run_['cpu_seconds']:.0f}")
            write(args.out, out)
    console.print(table)
    console.print(f"wrote {args.out}")
    return 0


def liar_run(config: SimConfig) -> dict:
    """One run, counting the trainer's checks that liars' claims alone asked for: the protocol's
    own pick of whom a confirmation is charged to (vrl.node.claims.LossClaims.charge) is wrapped
    to count, not changed."""
    started = time.process_time()
    sim = Simulation(config)
    liars = {n.key.node_id for n in sim.nodes if n.kind == "liar"}
    trainer = sim.nodes[0].protocol
    charges = {"liar": 0, "other": 0}
    claims = trainer.rounds.claims
    charge = claims.charge

    def counted(round_, claim, budget):
        charges["liar" if claim.verifier in liars else "other"] += 1
        charge(round_, claim, budget)

    claims.charge = counted
    summary = sim.run().summary
    quarantined = sorted(sim.metrics.version_at(t) for (observer, subject), t in sim.metrics.quarantined_at.items()
                         if observer == 0 and subject in liars)
    snapshots = sim.metrics.snapshots  # the trainer's checks in each round (between two of its announcements)
    versions = sorted(snapshots)
    return {
        "loss_claim_budget": trainer.config.loss_claim_budget,
        "trainer_checks_per_round": summary["per_node_trainer"].get("checks_per_round"),
        "trainer_verify_seconds_per_round": summary["per_node_trainer"].get("verify_seconds_per_round"),
        "member_checks_per_round": summary["per_node_others"].get("checks_per_round"),
        "per_round": [{"version": r["version"], "seconds": round(r["seconds"], 2)} for r in summary["per_round"]],
        "trainer_checks_by_round": [snapshots[b][1]["checks"][0] - snapshots[a][1]["checks"][0]
                                    for a, b in zip(versions, versions[1:])],
        "loss_confirmations_charged": charges,
        "liars": len(liars),
        "liars_quarantined_by_trainer": len(liars & trainer.quarantined),
        "liar_quarantine_versions": quarantined,
        "honest_false_quarantines": summary["honest_false_quarantines"],
        "bad_groups_trained": summary["bad_groups_trained"],
        "groups_lost": summary["groups_lost"],
        "rounds_measured": summary["rounds_measured"],
        "stopped": summary["stopped"],
        "cpu_seconds": time.process_time() - started,
    }


# -- withhold: withholding, a flood of fresh keys, churn ----------------------------------------------

# name -> (adversaries, churn), run side by side at each N with one seed
WITHHOLD_RUNS = {"honest": ("", 0.0), "withhold": ("withhold:0.3", 0.0),
                 "withhold+sybil": ("withhold:0.3,sybil:0.1", 0.0), "churn": ("", 0.1)}
# Per-node, per-round figures whose difference between the flood run and the withholding run
# (same seed) is the flood's cost to an honest node.
DELTAS = ("checks_per_round", "verify_seconds_per_round", "bytes_per_round", "bytes_per_round_without_blobs",
          "messages_per_round", "protocol_cpu_seconds_per_round", "backfill_bytes", "blob_bytes")
WITHHOLD_KEPT = ("nodes", "design", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds", "per_node",
                 "honest_false_quarantines", "bad_groups_trained", "groups_lost", "honest_groups_published",
                 "withheld_groups", "withholding", "sybil", "sybil_cost_at_honest_nodes", "trained_by_kind",
                 "honest_verdicts_not_counted_by_trainer", "trainer_waiting_verdicts", "churn",
                 "rounds_to_quarantine")


def withhold_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=counts_arg, default="11,50", help="node counts, each run in turn")
    options(parser, rounds=6, seed=0, cpu_limit=900.0, out=None)


def withhold(args: argparse.Namespace) -> int:
    """Withholding and a flood of fresh keys in the committee design, simulated (issue 30 item 3;
    specs/committee.md §7): the real NodeProtocol state machines of vrl.harness.simulator.

    For each N it runs, with one seed, side by side:

    * ``honest``: no adversary (the baseline the flood's cost is measured against);
    * ``withhold``: 30% of the nodes submit only half of their assigned groups;
    * ``withhold+sybil``: the same, plus a flood: each round every sybil slot (10% of N) mints a
      fresh key that submits a round of bad groups and hard-fails honest groups;
    * ``churn``: no adversary, 10% of the nodes leave for a round at each new version (honest
      leavers must not be quarantined, nor charged as withholding).

    It reports withholders' standing and share of batches against honest workers', and the flood's
    cost per fresh key at an honest node: what the flood run cost beyond the withholding run with
    the same seed (checks, verify-seconds, bytes, protocol CPU), and what the flood's own messages
    cost a receiver (bytes, signature checks, refusals by reason), against the bound of
    specs/committee.md §7. Runs of other N already in ``--out`` are kept (a sweep may be run in parts).

        python bench/simulate.py withhold --nodes 11,50 --rounds 6 --out bench/results/simulate-withhold.json
    """
    from vrl.harness.simulator.spec import sybil_slots

    earlier = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    out = {"commands": [*earlier.get("commands", [earlier["command"]] if "command" in earlier else []),
                        invocation(args)], "machine": machine("shared with other jobs; one run at a time"),
           "design": Verification.COMMITTEE, "what": what(withhold), "runs": earlier.get("runs", {}),
           "per_message_costs": per_message_costs()}
    print(f"per message: {out['per_message_costs']}", file=sys.stderr)
    for nodes in args.nodes:
        runs = {}
        for name, (adversaries_, churn) in WITHHOLD_RUNS.items():
            config = SimConfig(nodes=nodes, rounds=args.rounds, adversaries=parse_adversaries(adversaries_),
                               seed=args.seed, design=Verification.COMMITTEE, churn=churn)
            started = time.perf_counter()
            simulation = Simulation(config)
            pool = AdmissionPool(simulation)
            try:
                summary = simulation.run(None, args.cpu_limit).summary
            finally:
                drawn = pool.close()
            runs[name] = {k: summary[k] for k in WITHHOLD_KEPT if k in summary}
            runs[name]["admission_pool"] = drawn
            print(f"N={nodes} {name}: {time.perf_counter() - started:.0f} s wall ({summary['stopped']})",
                  file=sys.stderr)
        flood, base = runs["withhold+sybil"], runs["withhold"]
        keys_per_round = sybil_slots(parse_adversaries(WITHHOLD_RUNS["withhold+sybil"][0]), nodes)  # a key a slot
        if flood.get("per_node") and base.get("per_node") and keys_per_round:
            runs["flood_cost_per_key_per_honest_node"] = {
                "keys_per_round": keys_per_round,
                **{m: (flood["per_node"][m] - base["per_node"][m]) / keys_per_round for m in DELTAS}}
        out["runs"][str(nodes)] = runs
        if args.out:
            write(args.out, out)
    print(json.dumps(out, indent=1, sort_keys=True, default=str))
    return 0


def per_message_costs(repeat: int = 2000) -> dict:
    """What one fresh key's verdict costs a receiver that holds the round's manifest (decode and
    the claim's table lookup, specs/committee.md §4 steps 1-2), beside what an eligible one costs
    on top (its Ed25519 signature, its VRF proof): microseconds, median of 5 runs of ``repeat``."""
    import hashlib
    import statistics
    import timeit

    from proofs import vrf
    from vrl.node.committee import Draw, List
    from vrl.node.messages import SignedVerdict
    from vrl.node.rounds import Rounds
    from vrl.rollouts.keys import NodeKey

    trainer, member, stranger = (NodeKey.from_seed(hashlib.sha256(b"bench " + t).digest()) for t in (b"t", b"m", b"s"))
    groups = [(hashlib.sha256(b"g%d" % i).digest(), hashlib.sha256(b"w%d" % (i // 4)).digest()) for i in range(400)]
    rounds = Rounds(trainer, trainer.node_id)
    # A table of 1,000 eligible verifiers: the lookup's cost at the N the design is for.
    members = {hashlib.sha256(b"v%d" % i).digest(): 0.5 for i in range(999)} | {member.node_id: 1.0}
    manifest = rounds.close(0, 13, groups, members, 0.0)
    lists = rounds.lists[0]
    pi = vrf.prove(stranger.private_seed(), manifest.header.alpha(Draw.COMMITTEE))
    # The stranger claims a real weights entry's place and path (the most a refusal hashes: the
    # whole path, specs/committee.md §4 step 2), with its own key in the leaf.
    verdict = SignedVerdict(verifier=stranger.node_id, subject=groups[0][1], group=lists.content.groups[0], round=0,
                            policy_version=0, ticket=b"", rate=1.0, outcome="hard_fail", reasons=("reward_mismatch",),
                            digest=bytes(32), platform="bench", draw="committee", pi=pi, seat=0,
                            seat_path=lists.trees[List.GROUPS].prove([0]), weight_at=0, weight=65536,
                            weight_path=lists.trees[List.WEIGHTS].prove([0])).signed(stranger)
    data = verdict.to_bytes()
    assert rounds.refusal(verdict, frozenset()) == "not_eligible"

    def us(fn) -> float:
        return statistics.median(timeit.repeat(fn, number=repeat, repeat=5)) / repeat * 1e6

    return {"verdict_bytes": len(data), "manifest_groups": manifest.groups,
            "decode_us": us(lambda: SignedVerdict.from_bytes(data)),
            "refusal_not_eligible_us": us(lambda: rounds.refusal(verdict, frozenset())),
            "signature_check_us": us(lambda: verdict.signature_ok()),
            "vrf_verify_us": us(lambda: vrf.verify(stranger.node_id, pi, manifest.header.alpha(Draw.COMMITTEE)))}


class AdmissionPool:
    """How many decided groups each of the trainer's admission draws chose from, and of which
    kind (honest, withhold, ...): wraps ``admit`` where the trainer's batch rule calls it
    (vrl.node.batches) for the run, measuring only."""

    def __init__(self, simulation: Simulation) -> None:
        import vrl.node.batches as batches

        self.batches, self.admit, self.steps = batches, batches.admit, []
        kinds = {n.key.node_id: n.kind or "honest" for n in simulation.nodes}

        def counted(candidates, config, seed):
            candidates = list(candidates)
            batch = self.admit(candidates, config, seed)
            kind = [kinds.get(c.node, "other") for c in candidates]
            self.steps.append({"candidates": len(candidates), "batch": len(batch),
                               "candidates_by_kind": {k: kind.count(k) for k in sorted(set(kind))},
                               "batch_by_kind": {k: sum(kinds.get(c.node, "other") == k for c, _ in batch)
                                                 for k in sorted(set(kind))}})
            return batch

        batches.admit = counted

    def close(self) -> dict:
        self.batches.admit = self.admit
        full = sum(s["candidates"] <= s["batch"] for s in self.steps)
        return {"steps": len(self.steps), "steps_with_no_choice": full, "per_step": self.steps}


# -- memory: what the protocols keep over a run -------------------------------------------------------

def memory_options(parser: argparse.ArgumentParser) -> None:
    options(parser, nodes=100, rounds=40)
    parser.add_argument("--design", type=Verification, default=Verification.COMMITTEE, choices=tuple(Verification))
    options(parser, seed=0)
    parser.add_argument("--no-forget", action="store_true",
                        help="switch vrl.node.forgetting off in the same code: what forgetting saves")
    parser.add_argument("--deep", action="store_true",
                        help="also the deep sizes by part of the trainer's, node 1's and the middle node's state")
    parser.add_argument("--out", type=Path, help="add the run to this JSON file's 'runs'")


def memory(args: argparse.Namespace) -> int:
    """What a NodeProtocol keeps over a run, measured (vrl.node.forgetting): the simulator's N real
    protocols through R rounds, sampling after each of the trainer's rounds this process's resident
    memory and the sizes of what the protocols keep, with forgetting on or (``--no-forget``) off.

        PYTHONHASHSEED=0 python bench/simulate.py memory --nodes 100 --rounds 40 --design committee
        PYTHONHASHSEED=0 python bench/simulate.py memory --nodes 100 --rounds 40 --design committee --no-forget

    Each prints one JSON object; ``--out FILE`` adds it to FILE's ``runs``. Run the two modes in
    separate processes: resident memory is per process, and the peak (``ru_maxrss``) never falls.
    Growth per round is a least-squares slope over the second half of the rounds (after the
    bootstrap rounds, in the steady state).
    """
    from process_memory import peak_bytes, rss_bytes  # this folder (bench/) is first on sys.path

    from vrl.node import forgetting

    if args.no_forget:
        forgetting.forget = lambda node, version: None
    sim = Simulation(SimConfig(nodes=args.nodes, rounds=args.rounds, design=args.design, seed=args.seed))
    samples: list[dict] = []
    ended = sim.metrics.round_ended

    def round_ended(s, version: int) -> None:
        ended(s, version)
        samples.append({"version": version, "rss_bytes": rss_bytes(), **kept(s)})

    sim.metrics.round_ended = round_ended
    started = time.process_time()
    summary = sim.run().summary
    half = samples[len(samples) // 2:]
    growth = {name: slope([(s["version"], s[name]) for s in half]) for name in samples[0] if name != "version"}
    result = {
        "command": f"PYTHONHASHSEED=0 {invocation(args)}",
        "nodes": args.nodes, "rounds": args.rounds, "design": args.design, "forgetting": not args.no_forget,
        "peak_rss_bytes": peak_bytes(),
        "cpu_seconds": time.process_time() - started,
        "growth_per_round_second_half": growth,
        "last": samples[-1] if samples else {},
        "samples": samples,
        "metrics": {"per_node": summary["per_node"], "per_node_trainer": summary["per_node_trainer"],
                    "quarantines": summary["rounds_to_quarantine"],
                    "honest_false_quarantines": summary["honest_false_quarantines"],
                    "groups_lost": summary["groups_lost"],
                    "honest_verdicts_not_counted_by_trainer": summary["honest_verdicts_not_counted_by_trainer"],
                    "trainer_waiting_verdicts": summary["trainer_waiting_verdicts"],
                    "stopped": summary["stopped"]},
    }
    if args.deep:
        result["deep_kib"] = {str(i): {"reports_held": len(sim.nodes[i].protocol.reputation),
                                       **deep_sizes(sim.nodes[i].protocol)}
                              for i in (0, 1, args.nodes // 2)}
    if args.out:
        existing = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
        existing["runs"].append(result)
        args.out.write_text(json.dumps(existing, indent=1) + "\n")
    print(json.dumps(result))
    return 0


def kept(sim: Simulation) -> dict[str, int]:
    """What every protocol keeps, summed over the nodes: per group, per verdict, per report."""
    sizes = dict.fromkeys(("groups", "verdicts", "slots", "audit_draws", "forgotten", "reports",
                           "waiting_verdicts", "policies", "step_verdicts"), 0)
    for node in sim.nodes:
        p = node.protocol
        if p is None:
            continue
        held = p.held()
        for part in ("groups", "verdicts", "slots", "audit_draws"):
            sizes[part] += held[part]
        sizes["forgotten"] += len(getattr(p, "forgotten", ()))
        sizes["reports"] += len(p.reputation)
        sizes["waiting_verdicts"] += p.waiting_verdicts
        sizes["policies"] += len(p.policies)
        sizes["step_verdicts"] += sum(len(v) for v in p.step_verdicts.values())
    return sizes


def deep_size(obj, seen: set[int]) -> int:
    """Bytes of ``obj`` and all it refers to through containers and attributes, each object
    counted once over every call that shares ``seen`` (what one view holds that an earlier part
    does not)."""
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, list | tuple | set | frozenset):
            stack += list(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type):
            stack.append(o.__dict__)
        elif hasattr(o, "__slots__"):
            stack += [getattr(o, name) for name in o.__slots__ if hasattr(o, name)]
    return total


def deep_sizes(p) -> dict[str, int]:
    """One protocol's state by part, in KiB; the reports first, so what they share with the
    verdicts and groups counts as theirs (they outlive both)."""
    seen: set[int] = set()
    parts = {"reports": (p.reputation._reports, p.reputation._ordered, p.reputation._new),
             "verdicts": p.verdicts, "groups": (p.groups, p._by_version, p._slots),
             "forgotten": (p.forgotten, p.forgotten_fails), "audit_draws": p._audit_draws,
             "waiting": p.waiting._held, "policies": p.policies, "steps": p.steps.__dict__,
             "rounds": p.rounds.__dict__, "scans": p.scans.__dict__}
    return {name: deep_size(part, seen) // 1024 for name, part in parts.items()}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


# -- table: runs written by --json, as one per-node table by design and N -----------------------------

TABLE_COLUMNS = ("checks_per_round", "verify_seconds_per_round", "bytes_in", "bytes_out", "bytes_per_round",
                 "bytes_per_round_without_blobs", "blob_bytes", "backfill_bytes", "messages_per_round",
                 "protocol_cpu_seconds_per_round")
TABLE_KEPT = ("nodes", "design", "rounds_requested", "rounds_measured", "stopped", "cpu_seconds", "wall_seconds",
              "simulated_seconds", "trainer_version", "honest_false_quarantines", "bad_groups_trained", "groups_lost",
              "actions", "unhandled")


def table_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="COMMAND=PATH")
    options(parser, out=REQUIRED)
    parser.add_argument("--note", default="")
    parser.add_argument("--tickets-floor", default="", help="node counts, e.g. 100,1000")
    parser.add_argument("--into", action="store_true",
                        help="add the runs to --out's table: a row of the same design and N is replaced, the "
                             "rest kept, ratios recomputed")


def table(args: argparse.Namespace) -> int:
    """Combine runs of ``bench/simulate.py --json`` into one results file: the per-node table by
    design and N, each run's command, and the ratio of each per-node cost to the same design's
    smallest N (issue 30: the committee design at N = 1,000 within 1.5x of N = 10).

        python bench/simulate.py table --out bench/results/simulate-scale.json \\
            "python bench/simulate.py --nodes 10 --rounds 20 --design committee --json=/tmp/c10.json" ...

    Each argument is COMMAND=PATH: the command that wrote the run, and the JSON it wrote.
    ``--tickets-floor 100,1000`` adds, for N where the ticket design cannot be simulated here, the
    least it costs a node a round by its own rules (:func:`tickets_floor`), labelled as arithmetic.
    ``--into`` adds runs to the file ``--out`` names instead of writing a new one.
    """
    earlier = json.loads(args.out.read_text()) if args.into else {}
    designs: dict[str, dict[str, dict]] = earlier.get("designs", {})
    for given in args.runs:
        command, _, path = given.rpartition("=")
        run_ = json.loads(Path(path).read_text())
        entry = {key: run_.get(key) for key in TABLE_KEPT}
        for who in ("per_node", "per_node_others", "per_node_trainer"):
            values = run_.get(who) or {}
            entry[who] = {c: values.get(c) for c in TABLE_COLUMNS if c in values}
        entry["command"] = command
        designs.setdefault(run_["design"], {})[str(run_["nodes"])] = entry
    for runs in designs.values():
        smallest = runs[min(runs, key=int)]
        base = smallest["per_node_others"] or smallest["per_node"]
        for entry in runs.values():
            mine = entry["per_node_others"] or entry["per_node"]
            entry["ratio_to_smallest_n"] = {c: (mine[c] / base[c] if base.get(c) and mine.get(c) is not None else None)
                                            for c in TABLE_COLUMNS if c in mine}
    result = {"what": "per node and per round, means over nodes and measured rounds (bench/simulate.py); "
                      "per_node_others excludes the trainer, whose load grows with N by design "
                      "(specs/network.md §3.5); ratios are per_node_others against the design's smallest N",
              "machine": machine("shared with whatever else ran: cpu_seconds is each run's own; wall_seconds "
                                 "is not comparable"),
              "note": args.note or earlier.get("note", ""), "designs": designs,
              "tickets_floor": {**earlier.get("tickets_floor", {}),
                                **{n: tickets_floor(int(n)) for n in args.tickets_floor.split(",") if n}}}
    write(args.out, result)
    return 0


def tickets_floor(nodes: int) -> dict:
    """The ticket design's least per-node cost a round at ``nodes`` (specs/network.md §3.2, §5):
    every group is gossiped to every node, and every verifier publishes a verdict (a check or a
    signed skip) on every group of another producer, also gossiped to every node; a verifier
    checks each producer's groups at that producer's rate, at least ``check_floor``. So a node
    receives at least ``G`` groups and ``G (N - 2)`` verdicts, ``G = groups_per_round (N - 1)``,
    and checks at least ``check_floor x G``; weights, forwards, backfill and the newcomer checks
    (every producer's first ``newcomer_checks`` groups, by everyone) come on top. Sizes are the
    simulator's real messages (the devnet's record shape)."""
    from vrl.harness.simulator.payloads import Records
    from vrl.node.messages import Outcome, SignedVerdict, audit_ticket
    from vrl.node.reputation import ReputationConfig
    from vrl.rollouts.keys import NodeKey

    key = NodeKey.from_seed(bytes(32))
    group = Records(SimConfig()).group(key, 3, 0)
    verdict = SignedVerdict(key.node_id, key.node_id, group.digest, 3, 3, audit_ticket(key, group.digest), 0.1,
                            Outcome.SKIPPED, (), b"", "torch-2.13.0/cpu-AVX512/float32/sdpa/threads-1").signed(key)
    groups = ProtocolParams().groups_per_round * (nodes - 1)
    verdicts = groups * (nodes - 2)
    received = groups * len(group.to_bytes()) + verdicts * len(verdict.to_bytes())
    return {"nodes": nodes, "design": Verification.TICKETS, "kind": "arithmetic lower bound, not simulated",
            "checks_per_round_at_least": ReputationConfig().check_floor * groups,
            "bytes_in_per_round_at_least": received, "messages_in_per_round_at_least": groups + verdicts,
            "group_bytes": len(group.to_bytes()), "verdict_bytes": len(verdict.to_bytes()),
            "newcomer_checks_per_verifier": ReputationConfig().newcomer_checks * (nodes - 2)}


# -- wide: N = 1,000 on a machine of many cores --------------------------------------------------------

# What the simulator imports that a lent machine's image (device KINDS.md's package list) lacks.
WHEELS = ("async_generator base58 blake3 cffi cryptography dill dnspython mmh3 morphys multiaddr netaddr outcome "
          "py_cid py_multibase py_multicodec py_multihash pycparser pynacl python_baseconv sniffio structlog tomli_w "
          "trio trio_typing varint zstandard").split()


def wide_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("/tmp/wide-out"), help="the folder written")
    options(parser, nodes=1000, cpu_limit=480.0, batch_groups="round")
    parser.add_argument("--families", default="content,fabricated-reward,collude,lazy,withhold",
                        help="the adversary families, each at 10%%, 30%% and 45%% (three processes a family)")
    parser.add_argument("--wheels", action="store_true",
                        help="only fill .whl/ with the wheels of what a lent machine lacks, at this environment's "
                             "versions, for Python 3.12 on x86-64")


def wide(args: argparse.Namespace) -> int:
    """Issue 30's simulations at N = 1,000 on a machine with many cores (a machine lent through
    `device` has 16), one simulation a core, each under a CPU limit (``--cpu-limit``: the device
    tool's 600 s call, less start-up and headroom): what a 2-core machine cannot run in a session
    (about 150-200 CPU s a round at N = 1,000 with batches of a whole round). The simulator's
    counts (checks, bytes, quarantines) do not depend on the machine; its cpu_seconds do. Never
    needed by the tests.

    Writes to ``--out``: scale-N.json (``bench/simulate.py --json``, the committee design, 3
    warm-up and 20 rounds, batches of ``--batch-groups``: 'round' takes ~170 CPU s a round at
    N = 1,000, so about 3 rounds fit a call; the daemon's 12, 20 rounds in ~150 CPU s),
    adversaries-N-FAMILY.json (``bench/simulate.py adversaries``, one family at 10%, 30% and 45%),
    their logs, log.txt. A lent machine has no network: ``.whl/`` (ignored by git, carried) holds
    the wheels of what its image lacks. Fill it here first (``--wheels``), then on the machine:

        python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
            PYTHONPATH=/tmp/site python3 bench/simulate.py wide --out $OUT
    """
    if args.wheels:
        return wheels(ROOT / ".whl")
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "log.txt").open("a")

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        print(text, file=log, flush=True)

    say(f"{platform.processor() or platform.machine()} {os.cpu_count()} cores")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(ROOT)))),
           "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    me = [sys.executable, str(Path(__file__).resolve())]
    shared = ["--nodes", str(args.nodes), "--batch-groups", args.batch_groups, "--cpu-limit", str(args.cpu_limit)]
    scale = args.out / f"scale-{args.nodes}"
    jobs = [subprocess.Popen([*me, *shared, "--warmup", "3", "--rounds", "20", "--design", "committee", "--json"],
                             env=env, stdout=scale.with_suffix(".json").open("w"),
                             stderr=scale.with_suffix(".err").open("w"))]
    for family in args.families.split(","):
        named = args.out / f"adversaries-{args.nodes}-{family}"
        jobs.append(subprocess.Popen([*me, "adversaries", *shared, "--warmup", "1", "--rounds", "12", "--families",
                                      family, "--jobs", "3", "--out", str(named.with_suffix(".json"))],
                                     env=env, stdout=named.with_suffix(".log").open("w"), stderr=subprocess.STDOUT))
    failed = [job.args for job in jobs if job.wait()]
    for path in sorted(args.out.iterdir()):
        say(f"{path.stat().st_size:>12,} {path.name}")
    for command in failed:
        say(f"failed: {' '.join(command)}")
    return 1 if failed else 0


def wheels(folder: Path) -> int:
    """The wheels of :data:`WHEELS` at this environment's versions, for a lent machine's Python
    3.12 on x86-64: binary where one is published, else built from the (pure-Python) sdist."""
    from importlib.metadata import version

    folder.mkdir(exist_ok=True)
    platforms = [arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_26_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64", "manylinux1_x86_64") for arg in ("--platform", tag)]
    pip = [sys.executable, "-m", "pip"]
    for name in WHEELS:
        spec = f"{name}=={version(name)}"
        if subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                           "--implementation", "cp", *platforms, "-d", str(folder), spec],
                          stderr=subprocess.DEVNULL).returncode and \
                subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(folder), spec]).returncode:
            return 1
    return 0


# -- the command line ---------------------------------------------------------------------------------

SCENARIOS = {"adversaries": (adversaries_options, adversaries), "liar": (liar_options, liar),
             "withhold": (withhold_options, withhold), "memory": (memory_options, memory),
             "table": (table_options, table), "wide": (wide_options, wide)}


def parse(argv: list[str]) -> tuple[argparse.Namespace, object]:
    """The arguments and the runner of a command line: a scenario's when its first word names
    one (:data:`SCENARIOS`), else one run's (the flags alone, as before there were scenarios)."""
    argv = list(argv)
    scenario = argv.pop(0) if argv and argv[0] in SCENARIOS else None
    add, runner = SCENARIOS[scenario] if scenario else (one_options, one)
    parser = argparse.ArgumentParser(prog=" ".join(filter(None, ("bench/simulate.py", scenario))),
                                     description=inspect.cleandoc(runner.__doc__) if scenario else __doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add(parser)
    args = parser.parse_args(argv)
    args.scenario, args.argv = scenario, argv
    return args, runner


def main(argv: list[str] | None = None) -> int:
    args, runner = parse(sys.argv[1:] if argv is None else argv)
    try:
        return runner(args)
    except (SpecError, ConfigError) as error:  # a setting out of its range names itself
        console.print(f"[red]{error}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
