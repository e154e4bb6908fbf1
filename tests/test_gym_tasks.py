"""reasoning-gym task sets and the gym/v1 reward (specs/tasks.md §6, specs/rewards.md §3.7):
a spec is a task set or one line naming what is wrong, an index is the same task in any fresh
dataset and on any machine (specs/vectors/gym.json), and a verifier recomputes the reward from
the task a record carries and the completion text alone.

``python tests/test_gym_tasks.py`` rewrites specs/vectors/gym.json; run it only when §6 changes
on purpose (a new vrl/gym-* domain, another pinned release).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrl.rl.evaluate import held_out
from vrl.tasks import (
    HELD_OUT_SHARE,
    GymError,
    GymTasks,
    RewardSpec,
    Task,
    TaskFileError,
    assign,
    gym,
    in_order,
    is_held_out,
    open_task_set,
    parse_spec,
    task_spec,
)
from vrl.tasks.rewards import RewardError, RewardUnavailable

VECTORS = Path(__file__).resolve().parent.parent / "specs" / "vectors" / "gym.json"
CHAIN = "gym:chain_sum:max_terms=3,min_terms=2"
#: What the vectors pin: one dataset with config keys, one with none, and a mix (whose parts vary
#: along the indices), at small and huge indices.
VECTOR_TASKS = ((CHAIN, (0, 42, 2**63 + 5)), ("gym:leg_counting", (7,)), ("gym:chain_sum+leg_counting", (0, 1, 2, 3)))
REWARD_SPEC = ["gym", "format:0.1"]


def rewarded(spec: RewardSpec, task: Task, completions: list[str]) -> list[dict[str, Any]]:
    return [{"completion": text, "reward": spec.reward(task, text)} for text in completions]


def gym_vectors() -> dict[str, Any]:
    """specs/vectors/gym.json, from this implementation (see the module's docstring)."""
    tasks = []
    for spec, indices in VECTOR_TASKS:
        made = GymTasks.parse(spec)
        for index in indices:
            task, part = made.task(index), made.part(index)
            tasks.append({"spec": spec, "name": made.name, "index": index, "part": part.name,
                          "seed": part.seed(index), "id": task.id, "prompt": task.prompt, "answer": task.answer,
                          "held_out": is_held_out(task)})
    chain, legs = GymTasks.parse(CHAIN).task(42), GymTasks.parse("gym:leg_counting").task(7)
    rewards = []
    for texts, task, completions in (
        (REWARD_SPEC, chain, [f"<answer>{chain.answer}</answer>", f"I think so.\n<answer> {chain.answer} </answer>",
                              "<answer>-1</answer>", chain.answer, f"<answer>{chain.answer}</answer> and more"]),
        (["gym"], legs, [f"<answer>{legs.answer}</answer>", f"<answer>{legs.answer} legs</answer>",
                         "<answer></answer>", "no answer"]),
    ):
        spec = parse_spec(texts)
        rewards.append({"reward_spec": spec.to_wire(), "digest": spec.digest().hex(),
                        "term_identities": [t.identity().hex() for t in spec.terms],
                        "task": {"id": task.id, "prompt": task.prompt, "answer": task.answer},
                        "completions": rewarded(spec, task, completions)})
    return {"library": gym.VETTED, "tasks": tasks, "rewards": rewards}


# -- determinism --------------------------------------------------------------------------------


def test_the_vectors_are_what_this_machine_builds_and_scores():
    """The bytes of specs/vectors/gym.json, written on another machine: prompts, answers,
    seeds and rewards are the same here (another PYTHONHASHSEED, another global random state)."""
    assert json.loads(VECTORS.read_text()) == gym_vectors()


def test_the_vectors_seeds_and_mix_follow_the_spec_formulas():
    """specs/tasks.md §6.2 with hashlib alone."""
    for case in json.loads(VECTORS.read_text())["tasks"]:
        index, name = case["index"], case["name"]
        seed = hashlib.sha256(b"vrl/gym-seed/v1\x00" + case["part"].encode() + index.to_bytes(8, "big")).digest()
        assert case["seed"] == int.from_bytes(seed[:4], "big")
        parts = name.removeprefix("gym:").split("+")
        mix = hashlib.sha256(b"vrl/gym-mix/v1\x00" + name.encode() + index.to_bytes(8, "big")).digest()
        assert case["part"] == parts[int.from_bytes(mix[:8], "big") % len(parts) if len(parts) > 1 else 0]
        assert case["id"] == f"gym/0.1.25/{case['part']}/{index:016x}"
    assert len({c["part"] for c in json.loads(VECTORS.read_text())["tasks"] if "+" in c["name"]}) == 2


def test_an_index_is_the_same_task_in_two_fresh_datasets_and_is_reasoning_gyms_own_entry():
    import reasoning_gym

    tasks = GymTasks.parse("gym:basic_arithmetic:format_style=natural")
    first = [tasks.task(i) for i in (0, 1, 99, 2**64 - 1)]
    gym._build.cache_clear()  # built again from nothing: no dataset object is shared
    assert [GymTasks.parse("gym:basic_arithmetic:format_style=natural").task(i) for i in (0, 1, 99, 2**64 - 1)] == first
    part = tasks.parts[0]
    entry = reasoning_gym.create_dataset("basic_arithmetic", format_style="natural", seed=part.seed(99), size=1)[0]
    assert first[2].prompt == gym.prompt_text(entry["question"]) and first[2].answer == entry["answer"]
    assert first[2].prompt.startswith(reasoning_gym.utils.SYSTEM_PROMPTS["default"])
    assert len({t.prompt for t in first}) == 4


def test_the_name_is_canonical_and_its_tasks_the_same_however_the_spec_is_spelled():
    one = GymTasks.parse("gym:chain_sum:min_terms=02,max_terms=3,allow_negation=false")
    other = GymTasks.parse("gym:chain_sum:allow_negation=false,max_terms=3,min_terms=2")
    assert one.name == other.name == "gym:chain_sum:allow_negation=false,max_terms=3,min_terms=2"
    assert one.task(5) == other.task(5)
    assert GymTasks.parse(CHAIN).task(5) != one.task(5)  # another config key set: another seed


# -- held-out problems ------------------------------------------------------------------------------


def test_one_prompt_in_sixteen_is_held_out_and_assignment_never_draws_one():
    tasks = GymTasks.parse("gym:chain_sum")
    drawn = [tasks.task(i) for i in range(1600)]
    share = sum(map(is_held_out, drawn)) / len(drawn)
    assert abs(share - 1 / HELD_OUT_SHARE) < 0.025  # 1,600 draws: the binomial sd is 0.006
    seed = hashlib.sha256(b"round").digest()
    assigned = [assign(tasks, seed, bytes(32), g) for g in range(200)]
    assert not any(map(is_held_out, assigned))
    assert len({t.id for t in assigned}) > 190
    assert in_order(tasks, 0) is None  # a generated set has no end: an evaluation draws held-out ones
    evaluation = held_out(tasks, 16)
    assert len(evaluation) == 16 and all(map(is_held_out, evaluation))
    assert not {t.prompt for t in evaluation} & {t.prompt for t in assigned}


# -- the reward -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["gym:chain_sum", "gym:leg_counting", "gym:basic_arithmetic",
                                  "gym:chain_sum:min_terms=3+leg_counting"])
def test_the_right_answer_scores_one_and_a_wrong_one_zero(spec):
    reward = parse_spec(["gym"])
    for index in range(3):
        task = GymTasks.parse(spec).task(index)
        assert reward.reward(task, f"Step by step... <answer>{task.answer}</answer>") == 1.0
        assert reward.is_correct(task, f"<answer>{task.answer}</answer>")
        assert reward.reward(task, "<answer>not it</answer>") == 0.0
        assert reward.reward(task, task.answer) == 0.0  # untagged: no answer
        assert not reward.is_correct(task, "<answer>not it</answer>")


def test_a_verifier_recomputes_the_reward_from_what_a_record_carries():
    """Stage 8 without a model (specs/verification.md §1): the task is rebuilt from the record's
    task id, prompt and reference, the spec from its wire form, and the reward recomputed from
    the completion text equals the producer's; a fabricated one does not."""
    made = GymTasks.parse(CHAIN).task(42)
    spec = parse_spec(REWARD_SPEC)
    completion = f"so <answer>{made.answer}</answer>"
    claimed = spec.reward(made, completion)
    carried = Task(made.id, made.prompt, made.answer)  # vrl.rollouts.record.Rollout.task
    decoded = RewardSpec.from_wire(json.loads(json.dumps(spec.to_wire())))
    assert decoded.reward(carried, completion) == claimed == 1.1
    assert decoded.reward(carried, "<answer>0</answer>") != claimed
    gym._build.cache_clear()  # a verifier that never built the task itself
    assert decoded.reward(carried, completion) == claimed


def test_a_task_that_is_not_its_ids_is_an_error_not_a_score():
    """A prompt not the id's, an id that names a refused dataset (so no scorer evaluates the
    answer) or that is not written canonically, or no gym id at all: reward_mismatch's error."""
    made = GymTasks.parse(CHAIN).task(42)
    spec = parse_spec(["gym"])
    answer = f"<answer>{made.answer}</answer>"
    for task, problem in [
        (Task(made.id, made.prompt.replace("=", "= 1 +"), made.answer), "its prompt is not the one"),
        (Task("gym/0.1.25/countdown/0000000000000000", made.prompt, made.answer), "countdown is refused"),
        (Task(made.id.replace("min_terms=2", "min_terms=02"), made.prompt, made.answer), "not written canonically"),
        (Task("arithmetic/0000000000000000", "1+1=", "2"), "is not a gym task"),
    ]:
        with pytest.raises(RewardError, match=problem):
            spec.reward(task, answer)


def test_another_release_is_refused_as_unknown_not_scored(monkeypatch):
    made = GymTasks.parse(CHAIN).task(42)
    other = Task(made.id.replace("0.1.25", "0.1.26"), made.prompt, made.answer)
    with pytest.raises(RewardUnavailable, match="0.1.26"):
        parse_spec(["gym"]).reward(other, "<answer>1</answer>")
    assert parse_spec(["gym:library=0.1.24"]).unavailable() == [
        "gym/v1: it scores with reasoning-gym 0.1.24, this verifier with 0.1.25: a gym reward is computed only by "
        "the release it names"]
    monkeypatch.setattr(gym, "installed", lambda: "0.1.26")
    gym._build.cache_clear()
    assert parse_spec(["gym"]).unavailable() == [
        "gym/v1: reasoning-gym 0.1.26 is installed; vrl's gym tasks are vetted on 0.1.25 only (its problems and "
        "scores are the library's, so another version may make others)"]
    with pytest.raises(GymError, match="0.1.26 is installed"):
        open_task_set(CHAIN)
    with pytest.raises(RewardUnavailable, match="0.1.26 is installed"):
        parse_spec(["gym"]).reward(made, "<answer>1</answer>")


def test_a_scorer_that_raises_or_an_overlong_answer_scores_zero(monkeypatch):
    made = GymTasks.parse(CHAIN).task(42)
    spec = parse_spec(["gym"])
    assert spec.reward(made, "<answer>" + "1" * 8193 + "</answer>") == 0.0
    dataset, _ = gym.Part("chain_sum", (("max_terms", 3), ("min_terms", 2))).built(42)

    def broken(answer, entry):
        raise TypeError("cannot read it")

    monkeypatch.setattr(dataset, "score_answer", broken)
    assert spec.reward(made, f"<answer>{made.answer}</answer>") == 0.0


_HOSTILE = st.text(alphabet=st.sampled_from("<>/answer 0123456789-+.,[](){}'\"\\\n\u00e9\x00"), max_size=60)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(spec=st.sampled_from(["gym:chain_sum", "gym:leg_counting", "gym:basic_arithmetic", "gym:propositional_logic",
                             "gym:advanced_geometry", "gym:boxnet"]),
       index=st.integers(0, 3), text=_HOSTILE, tagged=st.booleans())
def test_any_completion_scores_a_finite_number_or_nothing_raises(spec, index, text, tagged):
    """Whatever a completion holds, gym/v1 is a finite float in [0, 1]: a scorer that cannot
    read an answer finds it wrong; it never makes a verifier's reward an error."""
    task = GymTasks.parse(spec).task(index)
    value = parse_spec(["gym"]).reward(task, f"<answer>{text}</answer>" if tagged else text)
    assert type(value) is float and 0.0 <= value <= 1.0


# -- specs and their errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "problem"), [
    ("gym", "expected gym:DATASET"),
    ("gym:", "expected gym:DATASET"),
    ("gym:chainsum", "no dataset 'chainsum'; did you mean chain_sum or"),
    ("gym:Chain", "is not a dataset name"),
    ("gym:countdown", "countdown is refused: its scorer evaluates the answer as Python"),
    ("gym:word_ladder", "word_ladder is refused: its problems differ between processes"),
    ("gym:game_of_life_halting", "game_of_life_halting is refused: its scorer gives full marks to any"),
    ("gym:composite", "no dataset 'composite'"),
    ("gym:chain_sum:min_term=2", "chain_sum has no config key 'min_term' (it has allow_negation, max_digits,"),
    ("gym:chain_sum:min_terms=two", "min_terms='two': expected an integer"),
    ("gym:chain_sum:min_terms=0", "the dataset refuses this config: 'min_terms must be positive'"),
    ("gym:chain_sum:min_terms", "cannot read 'min_terms' (expected key=value)"),
    ("gym:chain_sum:min_terms=2,min_terms=3", "min_terms is given twice"),
    ("gym:chain_sum:seed=1", "seed is set by vrl"),
    ("gym:chain_sum:allow_negation=yes", "expected true or false"),
    ("gym:basic_arithmetic:format_style=fancy", "expected one of simple, natural"),
    ("gym:basic_arithmetic:operators=+", "operators is a list[str]; a task spec sets only"),
    ("gym:chain_sum+chain_sum", "chain_sum appears twice"),
    ("gym:" + "+".join(["chain_sum"] * 17), "mixes 1 to 16 datasets, got 17"),
])
def test_a_bad_spec_is_one_line_naming_the_dataset_or_key(spec, problem):
    with pytest.raises(ValueError) as raised:
        open_task_set(spec)
    assert isinstance(raised.value, GymError) and problem in str(raised.value) and "\n" not in str(raised.value)
    assert task_spec(spec) == str(raised.value)


def test_a_gym_set_is_opened_and_checked_as_config_and_has_no_columns():
    tasks, skipped = open_task_set(CHAIN)
    assert isinstance(tasks, GymTasks) and tasks.name == CHAIN and skipped == []
    assert task_spec(CHAIN) is None
    with pytest.raises(TaskFileError, match="a gym task set has none"):
        open_task_set(CHAIN, columns="prompt=question")


def test_a_nodes_config_names_the_bad_gym_spec_in_one_line(tmp_path):
    """task_spec is the [work] task field's check: a node.toml's mistake is one line naming the
    file, the key and the dataset's own key (tests/test_config.py's mistakes, for gym)."""
    from vrl.node.config import ConfigError, NodeConfig

    path = tmp_path / "node.toml"
    path.write_text(f'data_dir = "d"\ntrainer = "{"ab" * 32}"\n[work]\ntask = "gym:chain_sum:min_term=2"\n')
    with pytest.raises(ConfigError) as caught:
        NodeConfig.from_toml(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: [work] task") and "no config key 'min_term'" in message
    assert "\n" not in message


_DATASETS = ["chain_sum", "leg_counting", "basic_arithmetic", "countdown", "composite", "nope", "Chain", ""]
_KEYS = ["min_terms", "max_terms", "allow_negation", "format_style", "operators", "seed", "size", "x", ""]
_VALUES = ["0", "2", "-3", "02", "1.5", "true", "false", "natural", "simple", "", "1e3", "a b", "\u00e9"]
_PART = st.builds(
    lambda name, pairs: name + (":" + ",".join(pairs) if pairs else ""),
    st.sampled_from(_DATASETS),
    st.lists(st.builds(lambda k, v, eq: f"{k}{eq}{v}", st.sampled_from(_KEYS), st.sampled_from(_VALUES),
                       st.sampled_from(["=", "=", ":", ""])), max_size=3))
_SPEC = st.one_of(
    st.builds(lambda parts: "gym:" + "+".join(parts), st.lists(_PART, min_size=1, max_size=3)),
    st.text(alphabet=st.sampled_from("gym:chain_sum+=,.-01\u00e9\x00"), max_size=30),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(spec=_SPEC)
def test_any_spec_is_a_canonical_task_set_or_one_gym_error_line(spec):
    """The parser never raises anything but a GymError of one line, and what it accepts it
    names canonically: the name reads back as the same set."""
    try:
        tasks = GymTasks.parse(spec)
    except GymError as error:
        assert str(error) and "\n" not in str(error)
        return
    again = GymTasks.parse(tasks.name)
    assert again == tasks and again.name == tasks.name
    assert len(tasks.parts[0].task_id(2**64 - 1).encode()) <= 256


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_gym_tasks.py --write  (rewrites specs/vectors/gym.json)")
    VECTORS.write_text(json.dumps(gym_vectors(), indent=1) + "\n")
    print(f"wrote {VECTORS.relative_to(Path.cwd()) if VECTORS.is_relative_to(Path.cwd()) else VECTORS}")
