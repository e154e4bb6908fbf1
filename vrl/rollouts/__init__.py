"""Rollouts: the layer every node and the verifier share.

Models and their hash (``model``, ``presets``), the forward passes (``forward``), generation
with the canonical sampler and commitments (``generate``), the signed record and its
canonical codec (``record``, ``codec``), rollout files (``files``), node keys (``keys``) and
the eight-stage verifier (``verify``). It knows tasks (:mod:`vrl.tasks`) and nothing of
training or the network.
"""

import os

# Set before any module of this layer imports transformers: nothing is ever downloaded (there
# is no hub here, and a node must not fetch code or weights it was not given).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
