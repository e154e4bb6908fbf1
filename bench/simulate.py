"""The protocol at scale, simulated: N real NodeProtocol state machines on a simulated clock and
network (vrl.harness.simulator; what is modelled and what is stubbed is said there).

    python bench/simulate.py --nodes 100 --rounds 20 --adversaries collude:0.3,lazy:0.1
    python bench/simulate.py --nodes 10 --rounds 5 --json                  # one JSON object
    python bench/simulate.py --compare bench/results/devnet-costs.json      # N = 5 and 12 beside the devnet
    python bench/simulate.py --sweep 10,100,1000 --rounds 20 --out bench/results/simulate-tickets.json

Per node and per round (means over nodes and the measured rounds, after --warmup rounds):
checks, verify-seconds, bytes in and out, messages; rounds from a cheater's first bad group to
its quarantine; honest false quarantines; bad groups trained; groups lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vrl.config import ConfigError  # noqa: E402
from vrl.harness.simulator import ALL_ADVERSARIES, SimConfig, Simulation, SpecError, parse_adversaries  # noqa: E402
from vrl.harness.simulator.stores import BACKFILL_MODELS  # noqa: E402
from vrl.node.params import ProtocolParams  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"
# What the calibration compares: issue 30 asks for agreement within 20% with the real devnet.
COMPARED = ("checks_per_round", "bytes_per_round", "bytes_per_round_without_blobs", "messages_per_round")
TOLERANCE = 0.20


def batch_groups_arg(text: str) -> str:
    """--batch-groups: 'round', or a whole number of groups from 1 (argparse names the flag on error)."""
    # isdigit() alone takes '¹' and other Unicode digits, which int() refuses (found by tests/test_bench_flags.py).
    if text in ("", "round") or (text.isascii() and text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"'round' or a whole number of groups >= 1, got {text!r}")


def batch_size(batch_groups: str, nodes: int) -> int | None:
    """The groups a step trains on for --batch-groups at ``nodes``: 'round' is every worker's round
    (devnet_costs.py's "paced" mode: the trainer steps on the round's decided groups, or at
    round_timeout, as a network of N workers would); '' is node.toml's default (None)."""
    if batch_groups == "round":
        return ProtocolParams().groups_per_round * (nodes - 1)
    return int(batch_groups) if batch_groups else None


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
    try:
        return key, kind(value) if kind in (int, float, str) else value
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}: not a {kind.__name__}: {value!r}") from None


def config_from(args: argparse.Namespace, nodes: int | None = None) -> SimConfig:
    partition = None
    if args.partition:
        start, end, share = args.partition.split(":")
        partition = (int(start), int(end), float(share))
    nodes = nodes or args.nodes
    batch = batch_size(args.batch_groups, nodes)
    admission = {} if batch is None else {"batch_groups": batch}
    return SimConfig(nodes=nodes, rounds=args.rounds, adversaries=parse_adversaries(args.adversaries),
                     seed=args.seed, design=args.design, warmup=args.warmup, latency_s=args.latency_ms / 1000,
                     bandwidth_bps=args.bandwidth_mbps * 1e6 / 8, loss=args.loss, partition=partition,
                     churn=args.churn, joins=args.joins, topology=args.topology, cores=args.cores, makers=args.makers,
                     admission=admission,
                     protocol=dict(args.protocol),
                     backfill=args.backfill or ("daemon" if args.compare else "gossip"),
                     **({"cost_file": args.cost} if args.cost else {}), **tokens_from(args.completion_tokens))


def tokens_from(completion_tokens: float | None) -> dict:
    """SimConfig's token settings for ``--completion-tokens``: that mean, and room for twice it."""
    if completion_tokens is None:
        return {}
    return {"completion_tokens": completion_tokens,
            "max_new_tokens": max(SimConfig.max_new_tokens, math.ceil(2 * completion_tokens))}


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
    """SimConfig fields of one devnet run (bench/devnet_costs.py): its design, its node.toml
    overrides ([protocol] and [admission], the paced mode's batch included), the group's shape
    and the tokens its records carried (read from the trainer's store), and the weights' size."""
    overrides = run_.get("overrides", {})
    tables = run_.get("tables") or settings.get("tables", {})
    protocol = {k: v for k, v in overrides.get("protocol", {}).items() if k != "verification"}
    out = {"design": run_.get("design", "tickets"), "protocol": protocol,
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
    """The simulator beside the real devnet (bench/devnet_costs.py's results) at each N it ran,
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
                    "groups_per_round": {"simulated": _groups_per_round(sim, config),
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
            "command": f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '(random)')} python bench/simulate.py "
                       + " ".join(sys.argv[1:]), "tolerance": TOLERANCE, "runs": out}


def _groups_per_round(sim: dict, config: SimConfig) -> float:
    """Groups the workers published a measured round, network-wide (the devnet's
    network.groups_published_per_round counts rollouts made / group_size)."""
    measured = sim.get("rounds_measured") or 0
    return sim.get("honest_groups_published", 0) / measured if measured else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run before the measured ones")
    parser.add_argument("--adversaries", default="",
                        help=f"kind:share,... of {', '.join(sorted(ALL_ADVERSARIES))}")
    parser.add_argument("--design", default="tickets", help="the verification design ProtocolParams selects")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=1.0, help="one-way latency per hop")
    parser.add_argument("--bandwidth-mbps", type=float, default=100.0, help="per link")
    parser.add_argument("--loss", type=float, default=0.0, help="share of gossip deliveries missed (backfilled)")
    parser.add_argument("--partition", default="", help="FROM:UNTIL:SHARE versions and share of nodes cut off")
    parser.add_argument("--churn", type=float, default=0.0, help="share of nodes that leave for a round per version")
    parser.add_argument("--joins", type=int, default=0, help="fresh honest nodes joining per version")
    parser.add_argument("--batch-groups", default="", type=batch_groups_arg,
                        help="groups a step trains on: a number, or 'round' (every worker's round); "
                             "default: node.toml's (vrl.node.config.NODE_OVERRIDES)")
    parser.add_argument("--completion-tokens", type=tokens_arg, default=None,
                        help="mean completion tokens a record (default: the devnet's base model's, 4)")
    parser.add_argument("--protocol", type=protocol_arg, action="append", default=[], metavar="KEY=VALUE",
                        help="a protocol parameter (vrl.node.params.ProtocolParams), e.g. submission_window=120")
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
    parser.add_argument("--cpu-limit", type=float, default=None, help="stop after this many CPU seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--compare", type=Path, default=None, help="bench/results/devnet-costs.json")
    parser.add_argument("--runs", default="", help="with --compare: indices of the file's runs to compare, e.g. 5,6 "
                                                    "(default: every run that finished)")
    parser.add_argument("--note", default="", help="with --compare: a note kept in the output (what the runs show)")
    parser.add_argument("--sweep", default="", help="node counts to run one after another, e.g. 10,100,1000")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        if args.compare:
            result = compare(args)
        elif args.sweep:
            result = {"runs": [run(config_from(args, int(n)), args.wall_limit, args.cpu_limit)
                               for n in args.sweep.split(",")]}
            for summary in result["runs"]:
                show(summary)
        else:
            result = run(config_from(args), args.wall_limit, args.cpu_limit)
            show(result)
    except (SpecError, ConfigError) as error:  # a setting out of its range names itself
        console.print(f"[red]{error}[/]")
        return 2
    text = json.dumps(result, indent=1, sort_keys=True, default=str)
    if args.out:
        args.out.write_text(text + "\n")
        console.print(f"wrote {args.out}")
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
