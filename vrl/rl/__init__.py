"""The RL loop on verified rollouts: GRPO's loss on one page (``grpo``), the single-machine
trainer (``train``), crash-safe checkpoints (``checkpoint``), held-out evaluation
(``evaluate``), the supervised base model (``base_model``) and the learning-curve plot
(``plots``). It builds on :mod:`vrl.rollouts` and :mod:`vrl.tasks`, never on the node.
"""
