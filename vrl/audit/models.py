"""The models an audit re-executes with (specs/audit.md §3): the network's base model, as the
inputs' node.toml names it, and policy versions loaded from their weights by hash; what the
``groups``, ``steps`` and ``accuracy`` checks share, loaded once before the first of them runs."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from proofs.sampling_params import SamplingParams
from proofs.zk import Srs
from vrl.audit.index import Run
from vrl.node.messages import Group, PolicyAnnouncement
from vrl.node.weights import WeightsError, from_blob
from vrl.rl.export import load_model
from vrl.rollouts.generate import choose_max_new_tokens
from vrl.rollouts.model import Model, ModelError
from vrl.rollouts.record import round_seed
from vrl.rollouts.verify import Expectations
from vrl.tasks import TaskFileError, open_task_set
from vrl.tasks.answers import committed_reference

# Policy versions held in memory at once: re-verification walks groups by version, and a
# version's groups are verified together, so two (one being replaced) is all it needs;
# a step replay holds its parent and its own besides (vrl.audit.replay).
_MODELS_KEPT = 2


class Models:
    """The network's base model, and policy versions loaded from their weights by hash."""

    def __init__(self, run: Run, srs: Sequence[Srs] = (), allow_dev: bool = False, allow_code: bool = False) -> None:
        """``srs`` and ``allow_dev``: what a private task set's reward proofs are checked
        against (specs/zk.md §11). ``allow_code``: re-execute a network whose reward runs code
        its task set and records carry (code/v1), which the inputs' node.toml names."""
        self.run, self.srs, self.allow_dev = run, tuple(srs), allow_dev
        self.private = False  # the task set's references are committed: correctness is proven
        self._base: Model | None = None
        self._versions: OrderedDict[int, Model] = OrderedDict()
        self.tasks = None
        self.max_new_tokens = 0  # the network's, once its task set is open
        self.problem: str | None = None  # why nothing can be re-executed, if so
        work = run.config.work if run.config is not None else None
        if work is None or work.model is None:
            self.problem = "no node.toml among the inputs names the network's model"
            return
        spec = work.model
        # The inputs' node.toml names the reward, so a network's audit would run code an
        # audited folder chose: only when the auditor asks for it (specs/audit.md §1).
        if (running := work.reward_spec.runs_code()) and not allow_code:
            self.problem = (f"the network's reward ({', '.join(running)}) runs code its task set and records carry; "
                            "re-execute it with --allow-code-rewards (allow_code_rewards=True)")
            return
        try:
            self._base = load_model(spec, dtype="float32")
        except ModelError as error:
            self.problem = f"the network's model cannot be loaded here: {error}"
            return
        try:
            self.tasks, _ = open_task_set(work.task, work.columns)
            self.private = any(committed_reference(t.answer) for t in getattr(self.tasks, "tasks", ()))
            # As the nodes chose it, when their [work] leaves it to the task set.
            self.max_new_tokens = choose_max_new_tokens(self._base, self.tasks, work.max_new_tokens)[0]
        except (TaskFileError, ValueError) as error:
            self.problem = f"the network's task set cannot be opened here: {error}"

    @property
    def base(self) -> Model:
        assert self._base is not None
        return self._base

    def version(self, a: PolicyAnnouncement) -> Model | None:
        """Version ``a``'s model, or None when its weights are not among the inputs (or are not
        what ``a`` announces)."""
        if a.version in self._versions:
            self._versions.move_to_end(a.version)
            return self._versions[a.version]
        blob = self.run.inputs.blob(a.blob)
        if blob is None:
            return None
        try:
            model = from_blob(self.base, blob, blob_hash=a.blob, model_hash=a.model_hash, name=f"policy@{a.version}")
        except WeightsError:
            return None
        self._versions[a.version] = model
        while len(self._versions) > _MODELS_KEPT:
            self._versions.popitem(last=False)
        return model

    def expectations(self, a: PolicyAnnouncement) -> Expectations:
        assert self.run.config is not None  # else __init__ set a problem, and nothing is re-executed
        work = self.run.config.work
        return Expectations(tasks=self.tasks, round_seed=round_seed(a.model_hash, a.version),
                            sampling=SamplingParams(work.temperature, 0, 1.0, self.max_new_tokens,
                                                    self.base.stop_token_ids),
                            reward_spec=work.reward_spec, correctness_later=self.private)

    def step_rewards(self, groups: list[Group], proofs: bytes) -> tuple[list[list[float]], str | None]:
        """A private task set's step: what it must have trained on, and why it is at fault
        (vrl.zk.step_rewards)."""
        from vrl.zk import step_rewards, work_directory

        return step_rewards([list(g.rollouts) for g in groups], proofs, self.base.decode, self.srs, work_directory(),
                            allow_dev=self.allow_dev)
