"""Rollouts: the layer every node and the verifier share.

Models and their hash (``model``, ``presets``), the forward passes (``forward``), generation
with the canonical sampler and commitments (``generate``), the signed record and its
canonical codec (``record``, ``codec``), rollout files (``files``), node keys (``keys``) and
the eight-stage verifier (``verify``). It knows tasks (:mod:`vrl.tasks`) and nothing of
training or the network.
"""

import os

# Set before any module of this layer imports transformers. Downloads are the user's to allow:
# a Hub id is fetched (weights, configs and tokenizer files only, never code: no model is
# loaded with trust_remote_code) unless HF_HUB_OFFLINE is set, as transformers does
# (vrl.rollouts.model.hub_snapshot).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
