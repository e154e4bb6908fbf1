"""Test vectors for specs/vectors/ (written by ``scripts/make-vectors``, checked by tests).

Every input is spelled out in the JSON, so a second implementation can check itself against
the files without running this code."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from blake3 import blake3

from proofs import commitment, merkle, prf, vrf
from proofs.sampler import sample
from proofs.sampling_params import SamplingParams
from vrl.node import committee
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import load_model, weights_hash
from vrl.rollouts.record import Rollout, round_seed, sample_seed
from vrl.tasks import Arithmetic, RewardSpec, Task, assign, assignment_draws, assignment_index, is_held_out, parse_spec

if TYPE_CHECKING:
    from vrl.node.messages import PolicyAnnouncement, Submission

VECTORS = Path(__file__).resolve().parents[2] / "specs" / "vectors"
SEED = hashlib.sha256(b"vrl test vector seed").digest()

#: A vector, or a case of one: a JSON object of the inputs and what they give (hex for bytes).
Vector = dict[str, Any]


def logits_case(vocab: int = 16) -> list[float]:
    return [round(math.sin(1.7 * i) * 2.5 + 0.1 * i, 6) for i in range(vocab)]


def sampler_vectors() -> Vector:
    noise = [{"position": p, "key": prf.position_key(SEED, p).hex(),
              "words": [f"{w:016x}" for w in prf.raw_words(SEED, p, 4)],
              "gumbel": [float(g) for g in prf.gumbel(SEED, p, 4)]} for p in (0, 1, 255)]
    races = []
    z = logits_case()
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 4, 1.0), (1.0, 0, 0.6), (0.0, 0, 1.0)]:
        params = SamplingParams(temperature, top_k, top_p, 16, ())
        for position in (0, 7):
            token, logprob = sample(torch.tensor([z], dtype=torch.float64), [SEED], [position], params)
            races.append({"temperature": temperature, "top_k": top_k, "top_p": top_p, "position": position,
                          "token": int(token[0]), "logprob": float(logprob[0])})
    return {
        "sample_seed": {"round_seed": bytes(range(32)).hex(), "node_id": bytes(32).hex(), "task_id": "t0",
                        "sample_index": 3, "seed": sample_seed(bytes(range(32)), bytes(32), "t0", 3).hex()},
        "seed": SEED.hex(), "noise": noise, "logits": z, "races": races,
    }


def commitment_rows() -> torch.Tensor:
    rows, width = 35, 40  # one full 32-row body chunk, a 2-row chunk, the closing row
    values = [[math.sin(0.37 * r + 1.3 * c) * (1 + (c % 7)) for c in range(width)] for r in range(rows)]
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


def commitment_vectors() -> Vector:
    rows = commitment_rows()
    bits = (rows.view(torch.int16).to(torch.int64) & 0xFFFF).tolist()
    return {"rows_bf16_bits": bits, "commitment": commitment.build(rows).hex()}


def record_vectors() -> Vector:
    key = NodeKey.from_seed(hashlib.sha256(b"vrl test vector key").digest())
    rollout = Rollout(
        node_id=key.node_id, model_hash=hashlib.sha256(b"model").digest(), policy_version=7,
        round_seed=bytes(range(32)), group_index=3, task_id="add-2-3", sample_index=1, group_size=4, prompt="2+3=",
        reference="5", prompt_tokens=(50, 43, 51, 61), completion_tokens=(53, 256), finish_reason="stop",
        sampling=SamplingParams(1.0, 0, 1.0, 64, (256,)), behaviour_logprobs=(-0.5, -1.25), reward=1.0,
        reward_spec=RewardSpec(), commitment=b"\x01\x20\x03" + bytes(8),
    ).signed(key)
    # The same record as version 2 wrote it (reward_spec {correct, format, tag}): still read.
    legacy = Rollout.from_bytes(rollout.to_bytes()).signed(key, version=2)
    return {"private_key_seed": hashlib.sha256(b"vrl test vector key").hexdigest(), "node_id": key.node_id.hex(),
            "signing_payload": rollout.signing_payload().hex(), "record": rollout.to_bytes().hex(),
            "signature": rollout.signature.hex(), "record_v2": legacy.to_bytes().hex()}


#: Reward cases (specs/rewards.md §3): each built-in, on completions that score and that do not.
#: code/v1 names Python 3.11, pyproject.toml's requires-python floor, so the file does not depend
#: on the interpreter that wrote it; only a 3.11 verifier recomputes its scores.
REWARD_CASES = [
    (["answer"], "5", ["5", "the answer is 5", "\\boxed{\\frac{10}{2}}", "4"]),
    (["answer:tag=answer", "format:0.1"], "5", ["<answer>5</answer>", "<answer>1,234</answer>",
                                                "<answer>5</answer> trailing", "5"]),
    (["numeric:abs_tol=0.01,rel_tol=0.0"], "3.14159", ["3.14", "3.15", "\\boxed{\\frac{22}{7}}", "pi"]),
    (["numeric:rel_tol=0.1,tag=answer"], "-200", ["<answer>-181</answer>", "<answer>-179</answer>", "-200"]),
    (["choice:choices=ABCDE"], "C", ["I pick (C).", "A cat: C, not D", "C or E? E", "none"]),
    (["choice:tag=answer"], "(B)", ["<answer>B</answer>", "<answer>(B).</answer>", "<answer>b</answer>"]),
    (["answer", "length-penalty:0.5:free=4,span=8"], "5", ["5", "so 5", "after a long while, 5", "it is 4"]),
    (["code:time_ms=2000,memory_mb=256,python=3.11"], "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n",
     ["```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a - b\n```",
      "```python\nimport os\nos._exit(0)\n```", "def add(a, b): return a + b"]),
]


def reward_vectors() -> list[Vector]:
    cases = []
    for texts, reference, completions in REWARD_CASES:
        spec = parse_spec(texts)
        cases.append({"reward_spec": spec.to_wire(), "digest": spec.digest().hex(),
                      "term_identities": [t.identity().hex() for t in spec.terms], "reference": reference,
                      "completions": [{"completion": text, "reward": spec.reward(Task("t", "", reference), text)}
                                      for text in completions]})
    return cases


def task_vectors() -> Vector:
    node = NodeKey.from_seed(hashlib.sha256(b"vrl test vector key").digest()).node_id
    generators = [Arithmetic(), Arithmetic(digits=3, operations="+-*", terms=3)]
    return {
        "round_seed": [{"checkpoint_hash": bytes(range(32)).hex(), "round": r,
                        "round_seed": round_seed(bytes(range(32)), r).hex()} for r in (0, 1, 2**40)],
        "assignment_index": [{"round_seed": bytes(range(32)).hex(), "node_id": node.hex(), "group_index": g,
                              "attempt": a, "index": assignment_index(bytes(range(32)), node, g, a)}
                             for g, a in ((0, 0), (1, 0), (7, 0), (7, 3))],
        "held_out": [{"prompt": prompt, "held_out": is_held_out(Task("t", prompt, ""))}
                     for prompt in ("1+1=", "17+25=", *_held_out_prompts(2))],
        # Groups whose first draw is a held-out problem, so assignment takes a later one.
        "assign": [{"task_set": Arithmetic().name, "round_seed": bytes(range(32)).hex(), "node_id": node.hex(),
                    "group_index": g, "draws": _draws(node, g),
                    "task_id": assign(Arithmetic(), bytes(range(32)), node, g).id}
                   for g in (0, *_skipping_groups(node, 2))],
        "arithmetic": [{"spec": gen.name, "index": i, "prompt": gen.task(i).prompt, "answer": gen.task(i).answer,
                        "id": gen.task(i).id} for gen in generators for i in (0, 1, 2**63 + 5)],
        "rewards": reward_vectors(),
    }


def _held_out_prompts(count: int) -> list[str]:
    """The first ``count`` held-out two-digit sums, in (a, b) order."""
    sums = (f"{a}+{b}=" for a in range(100) for b in range(100))
    return [p for p in sums if is_held_out(Task("t", p, ""))][:count]


def _draws(node: bytes, group: int) -> list[Vector]:
    """Each draw assignment makes for a group of the default arithmetic set, up to the one it keeps."""
    draws = []
    for attempt, task in enumerate(assignment_draws(Arithmetic(), bytes(range(32)), node, group)):
        draws.append({"attempt": attempt, "task_id": task.id, "prompt": task.prompt, "held_out": is_held_out(task)})
        if not draws[-1]["held_out"]:
            break
    return draws


def _skipping_groups(node: bytes, count: int) -> list[int]:
    return [g for g in range(10_000) if len(_draws(node, g)) > 1][:count]


def network_vectors() -> Vector:
    """Group digest, audit ticket and draw, recomputed digest, a verdict, a policy
    announcement (specs/network.md); a reputation and an admission case (specs/reputation.md)."""
    from vrl.node.admission import AdmissionConfig, Candidate, admit
    from vrl.node.messages import (
        Outcome,
        SignedVerdict,
        Submission,
        audit_ticket,
        recomputed_digest,
        ticket_selected,
    )
    from vrl.node.reputation import Report, ReputationConfig, compute

    key = NodeKey.from_seed(hashlib.sha256(b"vrl test vector key").digest())
    submission = Submission((b"record-0", b"record-1"))
    ticket = audit_ticket(key, submission.digest)
    verdict = SignedVerdict(key.node_id, bytes(32), submission.digest, 5, 4, ticket, 0.25, Outcome.HARD_FAIL,
                            ("reward_mismatch",), recomputed_digest([b"c0", b""]), "torch-2.13.0/cpu/float32/threads-1"
                            ).signed(key)
    policy = _policy(key)
    a, b, c = (bytes([i]) * 32 for i in (1, 2, 3))
    reports = [Report(0, a, b, bytes([g]) * 32, Outcome.PASS) for g in range(10)] + [
        Report(1, a, c, b"\x40" * 32, Outcome.HARD_FAIL), Report(1, b, c, b"\x40" * 32, Outcome.HARD_FAIL),
        Report(1, b, a, b"\x41" * 32, Outcome.PASS)]
    standings = compute(reports, frozenset({a}), 2, ReputationConfig())
    candidates = [Candidate(bytes([g]) * 32, bytes([g % 3]) * 32, (0.9, 0.3, 0.6)[g % 3]) for g in range(12)]
    withheld_case = _withheld_vectors(a, b)
    batch = admit(candidates, AdmissionConfig(batch_groups=6, node_cap=0.5, trusted_share=0.5), b"seed")
    return {
        "private_key_seed": hashlib.sha256(b"vrl test vector key").hexdigest(),
        "group": {"records": [r.hex() for r in submission.records], "message": submission.to_bytes().hex(),
                  "digest": submission.digest.hex()},
        "audit_ticket": {"ticket": ticket.hex(), "selected_at": {str(r): ticket_selected(ticket, r)
                                                                 for r in (0.0, 0.1, 0.5, 0.9, 1.0)}},
        "recomputed_digest": {"commitments": ["6330", ""], "digest": recomputed_digest([b"c0", b""]).hex()},
        "verdict": {"message": verdict.to_bytes().hex(), "signing_payload": verdict.signing_payload().hex(),
                    "id": verdict.id.hex()},
        "policy": {"message": policy.to_bytes().hex(), "signing_payload": policy.signing_payload().hex(),
                   "id": policy.id.hex()},
        "policy_delta": _message_case(_policy_with_delta(key)),
        "policy_batch_file": _policy_with_batch_file(key),
        "weights_delta": _weights_delta(),
        "reputation": {
            "pretrusted": [a.hex()], "round": 2,
            "reports": [{"round": r.round, "reporter": r.reporter.hex(), "subject": r.subject.hex(),
                         "group": r.group.hex(), "outcome": r.outcome} for r in reports],
            "standings": {n.hex(): {"score": st.score, "check_rate": st.check_rate, "quarantined": st.quarantined,
                                    "trust": st.trust} for n, st in standings.items()}},
        "reputation_withheld": withheld_case,
        "admission": {
            "config": {"batch_groups": 6, "node_cap": 0.5, "trusted_share": 0.5, "trusted_score": 0.5},
            "seed": b"seed".hex(),
            "candidates": [{"group": c.group.hex(), "node": c.node.hex(), "score": c.score} for c in candidates],
            "batch": [{"group": c.group.hex(), "weight": w} for c, w in batch]},
        "backfill": _backfill_vectors(submission),
    }


def _backfill_vectors(submission: Submission) -> Vector:
    """specs/network.md §6: a request by position, a client's first request by cursor, a page
    answering it (the group's message, a cursor of generation 0x0123456789abcdef), and a
    request by that cursor naming the group's message as held (``have``: salt 0x00..07)."""
    from vrl.node.requests import BackfillPage, BackfillRequest, short_id

    cursor = (0x0123456789ABCDEF, 1, 0, 7, 2**63 - 1, 0)
    salt = bytes(range(8))
    held = short_id(salt, submission.to_bytes())
    return {"request": BackfillRequest(4, 0).to_bytes().hex(),
            "request_cursor": BackfillRequest(4, 0, (0,) * 6).to_bytes().hex(),
            "page_cursor": BackfillPage((submission.to_bytes(),), 1, cursor).to_bytes().hex(),
            "request_have": BackfillRequest(4, 1, cursor, salt + held).to_bytes().hex(),
            "salt": salt.hex(), "short_id": held.hex(),
            "since": 4, "cursor": list(cursor)}


def _withheld_vectors(a: bytes, b: bytes) -> Vector:
    """Withheld records (specs/reputation.md §4 rule 5, §5; specs/committee.md §7.1): worker
    0x05 listed with 2 of 4 groups in round 3, both passed (one by two reporters); worker 0x06
    listed with 1 of 4 in round 4, with no pass (the floor w_withheld per slot)."""
    from vrl.node.messages import Outcome
    from vrl.node.reputation import Report, ReputationConfig, Withheld, compute

    w, v = bytes([5]) * 32, bytes([6]) * 32
    reports = [Report(3, a, w, b"\x50" * 32, Outcome.PASS), Report(3, a, w, b"\x51" * 32, Outcome.PASS),
               Report(3, b, w, b"\x50" * 32, Outcome.PASS), Report(2, a, b, b"\x52" * 32, Outcome.PASS)]
    withheld = [Withheld(3, w, 2, 2), Withheld(4, v, 1, 3)]
    standings = compute(reports, frozenset({a}), 5, ReputationConfig(), withheld)
    return {"pretrusted": [a.hex()], "round": 5, "groups_per_round": 4,
            "reports": [{"round": r.round, "reporter": r.reporter.hex(), "subject": r.subject.hex(),
                         "group": r.group.hex(), "outcome": r.outcome} for r in reports],
            "withheld": [{"round": x.round, "worker": x.worker.hex(), "listed": x.listed, "missing": x.missing}
                         for x in withheld],
            "standings": {n.hex(): {"score": standings[n].score, "passes": standings[n].passes,
                                    "failures": standings[n].failures, "quarantined": standings[n].quarantined}
                          for n in (w, v)}}


def _h(label: bytes) -> bytes:
    """The SHA-256 of a label: the announcements' stand-in hashes."""
    return hashlib.sha256(label).digest()


def _policy(key: NodeKey) -> PolicyAnnouncement:
    """Version 3, trained from version 2 on two groups, with reward proofs (specs/network.md §3.3)."""
    from vrl.node.messages import PolicyAnnouncement

    return PolicyAnnouncement(key.node_id, 3, _h(b"model"), _h(b"blob"), 1234, parent=_h(b"parent"),
                              batch=((_h(b"group-a"), 1.0), (_h(b"group-b"), 0.5)), config=_h(b"config"),
                              optimizer_before=_h(b"optimizer-2"), optimizer=_h(b"optimizer-3"), optimizer_size=2468,
                              platform="torch-2.13.0/cpu-AVX512/float32/default/threads-1", proofs=_h(b"proofs"),
                              proofs_size=4100).signed(key)


def _message_case(message: PolicyAnnouncement) -> Vector:
    return {"message": message.to_bytes().hex(), "signing_payload": message.signing_payload().hex(),
            "id": message.id.hex()}


def _policy_with_delta(key: NodeKey) -> PolicyAnnouncement:
    """The version 3 vector's announcement naming a weights delta: a version 4 message (specs/network.md §3.3)."""

    return dataclasses.replace(_policy(key), delta=_h(b"delta"), delta_size=567, delta_parent=_h(b"blob-2")).signed(key)


def _policy_with_batch_file(key: NodeKey) -> Vector:
    """The version 3 vector's step with its batch in a batch file: a version 5 message and the
    file it names (specs/network.md §3.3.1)."""

    from vrl.node.messages import BatchFile

    inline = _policy(key)
    file = BatchFile(key.node_id, inline.version, inline.batch).to_bytes()
    named = dataclasses.replace(inline, batch=(), batch_file=hashlib.sha256(file).digest(),
                                batch_size=len(file)).signed(key)
    return {**_message_case(named), "batch_file": file.hex()}


def _weights_delta() -> Vector:
    """A parent weights file, a target of the same layout (a float32 and a bfloat16 tensor, a few
    values changed), the byte planes of their XOR and the delta (specs/network.md §6.1)."""
    from safetensors.torch import save

    from vrl.node import deltas

    a = torch.tensor([1.0, -2.0, 0.5, 3.25], dtype=torch.float32)
    b = torch.tensor([0.125, 1.0, -1.5], dtype=torch.bfloat16)
    parent = save({"a": a, "b": b})
    target = save({"a": a + torch.tensor([0.0, 1e-6, 0.0, -2e-6]), "b": b + torch.tensor([0.0, 0.0, 0.25]).bfloat16()})
    delta = deltas.encode(parent, target)
    regions = deltas.layout(parent)
    xor = np.bitwise_xor(np.frombuffer(parent, np.uint8), np.frombuffer(target, np.uint8))
    return {"parent": parent.hex(), "target": target.hex(), "regions": [list(r) for r in regions],
            "planes": deltas._planes(xor, regions).tobytes().hex(), "delta": delta.hex(),
            "parent_hash": hashlib.sha256(parent).hexdigest(), "target_hash": hashlib.sha256(target).hexdigest()}


def training_vectors() -> Vector:
    """A step config file, an optimizer state file, a step ticket and a step verdict
    (specs/training.md)."""
    from vrl.node.messages import STEP_TICKET_DOMAIN, StepOutcome, StepVerdict, ticket_selected
    from vrl.rl.step import StepConfig, optimizer_bytes, optimizer_for

    key = NodeKey.from_seed(hashlib.sha256(b"vrl test vector key").digest())
    config = StepConfig(learning_rate=2e-5, warmup_steps=5, grad_clip=1.0, temperature=1.0, max_new_tokens=16)
    linear = _linear_example().requires_grad_(True)
    optimizer = optimizer_for(linear, config)
    empty = optimizer_bytes(linear, optimizer)
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate_at(0)
    linear(torch.ones(1, 3)).sum().backward()  # d/dw = 1 for every weight, d/db = 1
    optimizer.step()
    after = optimizer_bytes(linear, optimizer)
    policy = _policy(key)
    ticket = key.sign(STEP_TICKET_DOMAIN + policy.id)
    step = StepVerdict(key.node_id, policy.trainer, policy.version, policy.id, StepOutcome.FRAUD,
                       ("weights_mismatch",), hashlib.sha256(b"replayed").digest(), 0.0476,
                       "torch-2.13.0/cpu-AVX512/float32/default/threads-1").signed(key)
    return {
        "private_key_seed": hashlib.sha256(b"vrl test vector key").hexdigest(),
        "step_config": {"file": config.to_bytes().hex(), "hash": config.hash.hex(),
                        "learning_rate_at": {str(s): config.learning_rate_at(s) for s in (0, 1, 4, 5, 100)}},
        "optimizer": {"model": "the linear model of model.json; one AdamW step at learning_rate_at(0), gradient 1",
                      "empty": empty.hex(), "empty_hash": hashlib.sha256(empty).hexdigest(),
                      "after_one_step": after.hex(), "after_one_step_hash": hashlib.sha256(after).hexdigest(),
                      "weights_after": {n: t.detach().flatten().tolist()
                                        for n, t in sorted(linear.state_dict().items())}},
        "step_ticket": {"announcement_id": policy.id.hex(), "ticket": ticket.hex(),
                        "selected_at": {str(r): ticket_selected(ticket, r) for r in (0.0, 0.25, 0.5, 1.0)}},
        "step_verdict": {"message": step.to_bytes().hex(), "signing_payload": step.signing_payload().hex(),
                         "id": step.id.hex()},
    }


def model_vectors() -> Vector:
    linear = _linear_example()
    entries = {}
    for name, tensor in sorted(linear.state_dict().items()):
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        entries[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                         "raw": raw.hex(), "blake3": blake3(raw).hexdigest()}
    return {
        "linear": {"dtype": "float32", "state_dict": entries, "model_hash": weights_hash(linear, "float32").hex()},
        "tiny": {"dtype": "float32", "model_hash": load_model("tiny").model_hash.hex()},
        "micro": {"dtype": "float32", "model_hash": load_model("micro").model_hash.hex()},
    }


def sequential_vectors() -> Vector:
    """The sequential test's grid, e-values and decisions on fixed evidence (specs/verification.md §7)."""
    from vrl.rollouts.sequential import ALPHA, RaceTest, alternatives, log_e_value, threshold

    cases = []
    for q0, tokens, lost in [(1e-3, 0, 0), (1e-3, 1000, 1), (1e-3, 900, 9), (1e-3, 2000, 3), (2.5e-4, 400, 2),
                             (2.5e-4, 5000, 0), (0.01, 300, 12), (0.3, 10, 10)]:
        cases.append({"q0": q0, "tokens": tokens, "lost": lost, "log_e": log_e_value(tokens, lost, q0),
                      "rejected": RaceTest(q0, tokens, lost).rejected})
    return {"alpha": ALPHA, "threshold": threshold(), "grid_q0_1e-3": list(alternatives(1e-3)), "cases": cases}


def zk_vectors() -> Vector:
    """Field elements, Poseidon hashes, a reference commitment, answer-match instances and an
    attachment's bytes (specs/zk.md)."""
    from proofs import zk
    from proofs.circuits import (
        CIRCUITS,
        answer_codes,
        answer_match_instances,
        hidden_hash,
        quantize_hidden,
        reference_commitment,
    )
    from vrl.rollouts.record import Rollout
    from vrl.zk.sampling import challenged

    salt = bytes(range(0, 2 * 9, 1))  # nine u16 values: 0x0001, 0x0203, ... all below 2^15
    commitment = reference_commitment(b"n:42", salt)
    row = [round(math.sin(i) * 3, 6) for i in range(64)]
    row[0], row[1] = 0.5 / 8192, -1.5 / 8192  # two ties, to even: 0 and -2
    quantized = [int(v) for v in quantize_hidden([row])[0]]
    record = Rollout.from_bytes(bytes.fromhex(record_vectors()["record"]))
    challenge = bytes(range(32))
    attachment = zk.Attachment("answer-match/v1", bytes([1]) * 32, bytes([2]) * 32, bytes([3]) * 32, bytes([4]) * 32,
                               answer_match_instances(b"n:42", commitment, True), bytes(range(64)))
    return {
        "ezkl": zk.EZKL_VERSION,
        "felts": {str(v): zk.felt(v).hex() for v in (0, 1, 32767, 2**127 + 5, -1, -32768, -(2**127))},
        "poseidon": [{"values": v, "hash": zk.poseidon(v).hex()} for v in ([1, 2, 3], answer_codes(b"n:42"))],
        "answer_codes": {"form": "n:42", "codes": answer_codes(b"n:42")},
        "reference_commitment": {"form": "n:42", "salt": salt.hex(), "commitment": commitment.hex()},
        "answer_match_instances": {"answer": "n:42", "commitment": commitment.hex(), "correct": True,
                                   "instances": [i.hex() for i in answer_match_instances(b"n:42", commitment, True)]},
        "attachment": {"bytes": attachment.to_bytes().hex()},
        "circuits": {circuit.id: {"settings_hash": circuit.settings_hash.hex(), "proof_bytes": circuit.proof_bytes,
                                  "logrows": circuit.logrows} for circuit in CIRCUITS.values()},
        "hidden_state": {"row": row, "quantized": quantized, "hash": hidden_hash(quantized).hex()},
        "challenge": {"record": record.to_bytes().hex(), "challenge": challenge.hex(), "count": 3,
                      "positions": list(challenged(record, challenge, 3))},
        "task_set": _task_set_vectors(),
    }


def _task_set_vectors() -> Vector:
    """An evaluation claim's task set digest and round seed (specs/zk.md §9): a plain task and a
    chat task, and the plain task whose text is the chat task's messages, which is another set."""
    from vrl.tasks.chat import canonical_messages
    from vrl.zk import evaluation_seed, task_set_digest

    messages = canonical_messages([{"role": "user", "content": "2+2="}])
    tasks = [Task("t-0", "3+4=", "7"), Task("t-1", messages, "4", chat=True)]
    imitation = [tasks[0], Task("t-1", messages, "4")]
    model_hash = bytes(range(32))
    return {"tasks": [{"id": t.id, "prompt": t.prompt, "answer": t.answer, "chat": t.chat} for t in tasks],
            "digest": task_set_digest(tasks).hex(), "plain_digest": task_set_digest(imitation).hex(),
            "model_hash": model_hash.hex(), "seed": evaluation_seed(model_hash, task_set_digest(tasks)).hex()}


def _linear_example() -> torch.nn.Module:
    """A two-entry state dict with known values: weight (2, 3) = 0.5 * arange, bias = (-1, 1)."""
    linear = torch.nn.Linear(3, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5)
        linear.bias.copy_(torch.tensor([-1.0, 1.0]))
    return linear


#: RFC 9381 appendix B.3, examples 16 to 18 (ECVRF-EDWARDS25519-SHA512-TAI): secret key and
#: alpha; vrf_vectors writes the pi and beta the implementation computes, and tests/test_vrf.py
#: holds those to the RFC's.
RFC_9381_B3_INPUTS = [
    (16, "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", ""),
    (17, "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb", "72"),
    (18, "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7", "af82"),
]


def vrf_vectors() -> Vector:
    rfc = []
    for example, sk, alpha in RFC_9381_B3_INPUTS:
        pi = vrf.prove(bytes.fromhex(sk), bytes.fromhex(alpha))
        rfc.append({"example": example, "sk": sk, "pk": vrf.public_key(bytes.fromhex(sk)).hex(), "alpha": alpha,
                    "pi": pi.hex(), "beta": vrf.proof_to_hash(pi).hex()})
    key = NodeKey.from_seed(hashlib.sha256(b"vrl test vector key").digest())
    version, root = 7, hashlib.sha256(b"vrl test vector manifest").digest()
    node_alpha = committee.alpha(committee.Draw.COMMITTEE, version, root)  # specs/committee.md §2
    pi = vrf.prove(key.private_seed(), node_alpha)
    node = {"private_key_seed": key.private_seed().hex(), "node_id": key.node_id.hex(), "round": version,
            "manifest_root": root.hex(), "alpha": node_alpha.hex(), "pi": pi.hex(),
            "beta": vrf.verify(key.node_id, pi, node_alpha).hex()}
    return {"suite": "ECVRF-EDWARDS25519-SHA512-TAI", "suite_string": vrf.SUITE.hex(), "rfc9381": rfc, "node": node}


def committee_vectors() -> Vector:
    """specs/committee.md: a weights table, a round's lists and their header, both VRF inputs,
    three verifiers' weights entries, proofs, seat values, seats and claims, a key shown absent,
    withholding, and the escape bound and k for fixed (f*, eps)."""
    keys = [NodeKey.from_seed(hashlib.sha256(b"vrl committee vector key %d" % i).digest()) for i in range(3)]
    weights = {key.node_id: w for key, w in zip(keys, (1.0, 0.75, 0.5), strict=True)}
    table = committee.WeightsTable.of(2, weights)
    groups = tuple(sorted(hashlib.sha256(b"vrl committee vector group %d" % i).digest() for i in range(6)))
    workers = tuple(sorted([(keys[0].node_id, 4), (keys[2].node_id, 2)]))
    manifest = committee.ManifestContent(7, table, groups, workers)
    bounds = [{"k": k, "f": f, "escape_bound": committee.escape_bound(k, f)}
              for k in (4, 8, 13, 26) for f in (0.10, 0.30, 0.45)]
    smallest = [{"f_star": f, "eps": eps, "k": committee.smallest_k(f, eps)}
                for f in (0.10, 0.30, 0.45) for eps in (1e-2, 1e-3, 1e-6)]
    return {"round": manifest.round, "committee_size": table.committee_size,
            "weights_in": [[node.hex(), w] for node, w in sorted(weights.items())],
            "weights": [[node.hex(), w] for node, w in table.entries], "total": table.total,
            "groups": [d.hex() for d in groups], "workers": [[node.hex(), c] for node, c in workers],
            "groups_per_round": 4, "withheld": [[node.hex(), n] for node, n in sorted(manifest.withheld(4).items())],
            **_paged_vectors(manifest, keys), "bounds": bounds, "smallest_k": smallest}


def _paged_vectors(manifest: committee.ManifestContent, keys: list[NodeKey]) -> Vector:
    """specs/committee.md §10 over the same content: the header and its root, each verifier's
    weights entry by key, its seats by position and their entries, a claim's two paths, and a
    key shown absent by its neighbours."""
    paged = committee.PagedManifest(manifest)
    header = paged.header

    def entries(answer: committee.Entries) -> Vector:
        return {"positions": list(answer.positions), "leaves": [leaf.hex() for leaf in answer.leaves],
                "proof": [h.hex() for h in answer.proof]}

    verifiers: list[Vector] = []
    for key in keys:
        found = paged.answer(committee.List.WEIGHTS, keys=[key.node_id])
        j, leaf = found.found()[key.node_id]
        w = int.from_bytes(leaf[32:], "big")
        pi = vrf.prove(key.private_seed(), header.alpha(committee.Draw.COMMITTEE))
        beta = vrf.proof_to_hash(pi)
        positions = header.seats(beta, w)
        case: Vector = {"private_key_seed": key.private_seed().hex(), "node_id": key.node_id.hex(),
                        "weights_entry": entries(found), "threshold": header.threshold(w), "pi": pi.hex(),
                        "beta": beta.hex(), "seat_values": [header.seat_value(beta, i) for i in range(header.groups)],
                        "seats": list(positions)}
        recheck = vrf.prove(key.private_seed(), header.alpha(committee.Draw.RECHECK))
        case["recheck"] = {"pi": recheck.hex(), "beta": vrf.proof_to_hash(recheck).hex()}
        if positions:
            case["seat_entries"] = entries(paged.answer(committee.List.GROUPS, positions=positions))
            case["claim"] = {"seat": positions[0], "weight": [j, w],
                             "paths": [[h.hex() for h in paged.trees[committee.List.GROUPS].prove([positions[0]])],
                                       [h.hex() for h in paged.trees[committee.List.WEIGHTS].prove([j])]]}
        verifiers.append(case)
    absent = hashlib.sha256(b"vrl committee vector absent group").digest()
    # Both seat rules over more positions than the lists hold: rule 2's block counter (8
    # positions a SHA-512) moves twice in 20, and rule 1's manifest root is v2's.
    beta = bytes.fromhex(verifiers[0]["beta"])
    rules = {"beta": beta.hex(), "positions": 20,
             "manifest_roots": {str(rule): dataclasses.replace(header, seat_rule=rule).root.hex()
                                for rule in committee.SEAT_RULES},
             "seat_values": {str(rule): [committee.seat_value(beta, i, rule) for i in range(20)]
                             for rule in committee.SEAT_RULES}}
    return {"header": {"round": header.round, "committee_size": header.committee_size,
                       "seat_rule": header.seat_rule,
                       "groups": [header.groups, header.groups_root.hex()],
                       "weights": [header.weights, header.total_weight, header.weights_root.hex()],
                       "workers": [header.workers, header.workers_root.hex()]},
            "manifest_root": header.root.hex(), "alpha_committee": header.alpha(committee.Draw.COMMITTEE).hex(),
            "alpha_recheck": header.alpha(committee.Draw.RECHECK).hex(), "verifiers": verifiers,
            "absent_key": {"key": absent.hex(), **entries(paged.answer(committee.List.GROUPS, keys=[absent]))},
            "seat_rules": rules}


def merkle_vectors() -> Vector:
    """specs/merkle.md: roots of lists of 0 to 9 leaves, and multiproofs of position sets in a
    tree of 13, the one-position case included."""
    leaves = [hashlib.sha256(b"vrl merkle vector leaf %d" % i).digest()[: 1 + i % 32] for i in range(13)]
    tree = merkle.Tree(leaves)
    sets = [[0], [12], [5], [0, 12], [3, 4, 5], [1, 6, 7, 11], list(range(13))]
    return {"leaves": [leaf.hex() for leaf in leaves],
            "roots": [merkle.root(leaves[:n]).hex() for n in range(10)],
            "root": tree.root.hex(),
            "proofs": [{"positions": positions, "proof": [h.hex() for h in tree.prove(positions)]}
                       for positions in sets]}


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, make in [("sampler", sampler_vectors), ("commitment", commitment_vectors),
                       ("record", record_vectors), ("tasks", task_vectors), ("network", network_vectors),
                       ("training", training_vectors), ("model", model_vectors),
                       ("sequential", sequential_vectors), ("zk", zk_vectors), ("vrf", vrf_vectors),
                       ("committee", committee_vectors), ("merkle", merkle_vectors)]:
        (VECTORS / f"{name}.json").write_text(json.dumps(make(), indent=1) + "\n")
        print(f"wrote specs/vectors/{name}.json")


if __name__ == "__main__":
    main()
