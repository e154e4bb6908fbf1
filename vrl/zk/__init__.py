"""Optional zk proofs, as records use them (specs/zk.md): :mod:`vrl.zk.rewards`, rewards
proven against private reference answers and the held-out claims built on them (§5, §7, §9);
:mod:`vrl.zk.sampling`, sampled tokens proven at challenged positions (§10). The circuits and
ezkl itself are :mod:`proofs.zk`'s. This package sits beside :mod:`vrl.rl`, above the records
and below the node, which asks for sampling proofs."""

from vrl.zk.rewards import (
    CLAIM_DOMAIN,
    CLAIM_FORMAT,
    EVALUATION_DOMAIN,
    MAX_ATTACHMENTS,
    MAX_CLAIM_BYTES,
    MAX_COMPANION_BYTES,
    MAX_KEY_BYTES,
    MAX_KEY_LINES,
    ZK_FILE_FORMAT,
    AnswerKey,
    Claim,
    ClaimCheck,
    Statement,
    ZkFileError,
    attachments_bytes,
    attachments_from_bytes,
    check_claim,
    check_claim_file,
    commit_answers,
    companion_path,
    evaluate_private,
    evaluation_sampling,
    evaluation_seed,
    max_proofs_bytes,
    named_proofs,
    proof_plan,
    prove_rewards,
    prove_statements,
    proven_correctness,
    read_attachments,
    record_subject,
    regular_file_bytes,
    step_rewards,
    task_set_digest,
    training_rewards,
    work_directory,
    write_attachments,
    write_claim,
    write_key,
    write_task_file,
)

__all__ = [
    "CLAIM_DOMAIN", "CLAIM_FORMAT", "EVALUATION_DOMAIN", "MAX_ATTACHMENTS", "MAX_CLAIM_BYTES", "MAX_COMPANION_BYTES",
    "MAX_KEY_BYTES", "MAX_KEY_LINES", "ZK_FILE_FORMAT", "AnswerKey", "Claim", "ClaimCheck", "Statement",
    "ZkFileError", "attachments_bytes", "attachments_from_bytes", "check_claim", "check_claim_file",
    "commit_answers", "companion_path", "evaluate_private", "evaluation_sampling", "evaluation_seed",
    "max_proofs_bytes", "named_proofs", "proof_plan", "prove_rewards", "prove_statements", "proven_correctness",
    "read_attachments",
    "record_subject", "regular_file_bytes", "step_rewards", "task_set_digest", "training_rewards", "work_directory",
    "write_attachments", "write_claim", "write_key", "write_task_file",
]
