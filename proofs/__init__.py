"""Proof systems for verifiable rollouts: the canonical sampler and its replay check, and
activation commitments, and optional zk proofs with ezkl (specs/zk.md). Knows
tensors and bytes; nothing about RL or networking, and never imports :mod:`vrl`."""

from proofs.errors import InvalidParameters, MalformedCommitment, ProofsError
from proofs.sampling_params import SamplingParams

__all__ = ["InvalidParameters", "MalformedCommitment", "ProofsError", "SamplingParams"]
