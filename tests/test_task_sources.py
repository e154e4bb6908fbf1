"""Task sets in the forms people keep them (issue 18, items 3 and 5): MATH rows, chat prompts
rendered with the model's own template, `datasets` directories and CSV files, column
mapping, a file with no usable row that says why, and a generation length chosen from the
task set rather than the arithmetic set's 8 tokens."""

from __future__ import annotations

import concurrent.futures
import json
import re
import tomllib

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vrl.cli import app
from vrl.rollouts.generate import (
    FREE_TEXT_MAX_NEW_TOKENS,
    LENGTH_STEP,
    choose_max_new_tokens,
    generate,
    sampling_for,
)
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import load_model
from vrl.rollouts.verify import Expectations, verify
from vrl.tasks import Task, TaskFileError, TaskList, is_held_out, open_task_set
from vrl.tasks.chat import ChatTemplateError, canonical_messages
from vrl.tasks.core import oversized
from vrl.tasks.files import MATH_TEMPLATE, parse_columns, read_task_file, task_row


@pytest.fixture
def datasets():
    """The datasets library (the test extra has it): only its tests need it."""
    module = pytest.importorskip("datasets")
    module.disable_progress_bars()
    return module

# A short template of the usual shape: each message in a role marker, then the assistant's
# turn opened (add_generation_prompt).
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# As Llama 3.1's: a date_string the caller gives, else the clock, else a fixed date.
DATED = ("{%- if not date_string is defined %}{%- if strftime_now is defined %}"
         "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '1 Jan 2000' %}"
         "{%- endif %}{%- endif %}Today Date: {{ date_string }}\n" + TEMPLATE)


def lines(path, rows: list) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The tiny preset saved as a model directory whose tokenizer has a chat template: the
    loading path a real chat model takes."""
    model = load_model("tiny")
    model.tokenizer.chat_template = TEMPLATE
    directory = model.save(tmp_path_factory.mktemp("chat") / "tiny-chat")
    model.tokenizer.chat_template = None  # the preset is cached: leave it as it was
    return str(directory)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("key") / "node.pem"
    NodeKey.generate().save(path)
    return str(path)


# -- MATH rows ------------------------------------------------------------------------------------

def test_math_rows_take_the_last_boxed_answer_of_the_solution(tmp_path):
    path = lines(tmp_path / "math.jsonl", [
        {"problem": "Half of one?", "solution": "First \\boxed{2}, no: it is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Name it.", "solution": "The set is \\boxed{\\{1, 2\\}}"},
        {"problem": "Given.", "solution": "\\boxed{7}", "answer": "8"},  # an answer field wins
        {"problem": "No box.", "solution": "It is 3."},
        {"problem": "Empty box.", "solution": "\\boxed{ }"},
        {"problem": "", "solution": "\\boxed{1}"},
    ])
    tasks, errors = read_task_file(path)
    assert tasks == [Task("math:1", MATH_TEMPLATE.format(problem="Half of one?"), "1/2"),
                     Task("math:2", MATH_TEMPLATE.format(problem="Name it."), "\\{1, 2\\}"),
                     Task("math:3", MATH_TEMPLATE.format(problem="Given."), "8")]
    assert tasks[0].solution.startswith("First")  # kept for the generation length, not the task's identity
    assert [str(e).split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (4, 5, 6)]
    assert "\\boxed" in str(errors[0]) and "\\boxed" in str(errors[1]) and "'problem': empty" in str(errors[2])


# -- columns --------------------------------------------------------------------------------------

def test_columns_map_a_files_own_names_to_the_fields(tmp_path):
    path = lines(tmp_path / "own.jsonl", [{"uid": 7, "text": "2+2=", "target": 4},
                                          {"uid": "b", "text": "Capital of France?", "target": "Paris"},
                                          {"uid": "c", "words": "no text column"}])
    tasks, errors = read_task_file(path, columns=parse_columns("id=uid, prompt=text ,answer=target"))
    assert tasks == [Task("7", "2+2=", "4"), Task("b", "Capital of France?", "Paris")]
    assert (len(errors) == 1 and "no column 'text' (columns prompt=text)" in str(errors[0])
            and "'words'" in str(errors[0]))
    # A GSM8K question mapped to prompt makes a generic row: the question is the prompt, bare.
    gsm8k = lines(tmp_path / "g.jsonl", [{"question": "Q?", "final": "5"}])
    assert read_task_file(gsm8k, columns={"prompt": "question", "answer": "final"})[0] == [Task("g:1", "Q?", "5")]


@pytest.mark.parametrize(("text", "problem"), [("prompt", "not FIELD=COLUMN"), ("prompt=", "not FIELD=COLUMN"),
                                               ("prmpt=q", "no field"), ("prompt=a,prompt=b", "mapped twice")])
def test_a_columns_mistake_names_the_item(text, problem):
    with pytest.raises(TaskFileError, match=problem):
        parse_columns(text)


def test_a_row_without_any_prompt_field_says_which_fields_it_has(tmp_path):
    path = lines(tmp_path / "other.jsonl", [{"instruction": "Add.", "output": "3"}])
    (error,) = read_task_file(path)[1]
    assert "no 'prompt', 'question' or 'problem' field (it has 'instruction', 'output')" in str(error)
    assert "--columns prompt=COLUMN" in str(error)


def test_a_task_longer_than_a_record_carries_is_skipped_when_read(tmp_path):
    """A 257-byte id was read, generated from, and made records that no one, the producer
    included, could decode (specs/record.md §3): it is refused when the file is read, in bytes."""
    from vrl.tasks.core import MAX_TASK_ID_BYTES, MAX_TEXT_BYTES

    longest = "é" * (MAX_TASK_ID_BYTES // 2)  # 256 bytes in 128 characters
    path = lines(tmp_path / "long.jsonl", [
        {"id": longest, "prompt": "1+1=", "answer": "2"},
        {"id": longest + "x", "prompt": "1+2=", "answer": "3"},
        {"id": "big", "prompt": "x" * (MAX_TEXT_BYTES + 1), "answer": "1"},
        {"id": "wide", "prompt": "2+2=", "answer": "€" * (MAX_TEXT_BYTES // 3 + 1)}])
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == [longest]
    assert [str(e) for e in errors] == [
        f"{path}:2: field 'id': 257 bytes, more than a record carries (256)",
        f"{path}:3: field 'prompt': {MAX_TEXT_BYTES + 1} bytes, more than a record carries ({MAX_TEXT_BYTES})",
        f"{path}:4: field 'answer': {3 * (MAX_TEXT_BYTES // 3 + 1)} bytes, "
        f"more than a record carries ({MAX_TEXT_BYTES})"]
    with pytest.raises(ValueError, match="task set 't': task 'big': field 'prompt'"):
        TaskList("t", (Task("big", "x" * (MAX_TEXT_BYTES + 1), "1"),))


def test_a_rendered_prompt_longer_than_a_record_carries_is_refused_before_generation(tiny):
    """A chat task within the file's bounds can render past them (a template may repeat the
    messages), and a short text can be more tokens than a record holds: either is refused when
    the prompts are first rendered, naming the task set and the task."""
    from vrl.rollouts.generate import longest_prompt, prompt_of
    from vrl.rollouts.record import MAX_PROMPT_TOKENS
    from vrl.tasks.core import MAX_TEXT_BYTES

    content = "x" * (MAX_TEXT_BYTES // 2)
    chat = Task("wide", canonical_messages([{"role": "user", "content": content}]), "1", chat=True)
    assert oversized(chat) is None  # the file's bound passes it
    tiny.tokenizer.chat_template = ("{{ messages[0]['content'] }}{{ messages[0]['content'] }}"
                                    "{{ messages[0]['content'] }}")
    try:
        with pytest.raises(TaskFileError, match=f"long: task 'wide': its prompt as the model is given it is "
                                                f"{3 * len(content)} bytes, more than a record carries"):
            longest_prompt(tiny, TaskList("long", (chat, Task("short", "1+1=", "2"))))
    finally:
        tiny.tokenizer.chat_template = None  # the preset is cached: leave it as it was
    many = Task("many", "7" * (MAX_PROMPT_TOKENS + 1), "7")  # one token a byte for tiny's tokenizer
    with pytest.raises(TaskFileError, match=f"task 'many': its prompt is {MAX_PROMPT_TOKENS + 1} tokens"):
        prompt_of(tiny, many)
    text, tokens = prompt_of(tiny, Task("fits", "7" * MAX_PROMPT_TOKENS, "7"))
    assert len(tokens) == MAX_PROMPT_TOKENS and text == "7" * MAX_PROMPT_TOKENS


# -- no usable row: the reasons, not a count -----------------------------------------------------

def test_a_file_without_a_usable_row_shows_the_first_five_reasons(tmp_path):
    path = lines(tmp_path / "bad.jsonl", ["not json", {"x": 1}, {"prompt": 5}, {"id": "a", "prompt": "p"},
                                          ["list"], {"question": "q", "answer": "no hashes"}, "{"])
    with pytest.raises(TaskFileError) as caught:
        open_task_set(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: no usable task (7 lines skipped):")
    shown = message.splitlines()[1:]
    assert [line.split(": ", 1)[0].strip() for line in shown[:5]] == [f"{path}:{n}" for n in range(1, 6)]
    assert "not JSON" in shown[0] and "field 'answer'" in shown[3] and shown[5].strip() == "... and 2 more"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TaskFileError, match="no usable task: it holds no rows"):
        open_task_set(str(empty))


def test_the_cli_and_the_node_show_the_reasons(tmp_path, key_file):
    from p2p.loopback import LoopbackNetwork
    from vrl.node.config import ConfigError, NodeConfig
    from vrl.node.run import open_node

    path = lines(tmp_path / "wrong-columns.jsonl", [{"q": "1+1=", "a": "2"}, {"q": "2+2=", "a": "4"}])
    result = invoke("generate", "--model", "tiny", "--task", path, "--key", key_file, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    assert f"{path}:2: no 'prompt', 'question' or 'problem' field (it has 'q', 'a')" in result.output
    key = NodeKey.generate()
    settings = NodeConfig(data_dir=str(tmp_path / "node"), trainer=key.node_id.hex(), transport="loopback",
                          work={"model": "tiny", "task": path})
    with pytest.raises(ConfigError) as caught:
        open_node(settings, LoopbackNetwork(seed=1).transport(key.private_seed()), key, structlog.get_logger())
    assert str(caught.value).startswith("[work] task: ") and f"{path}:1: no 'prompt'" in str(caught.value)


# -- datasets: save_to_disk directories, CSV files -----------------------------------------------

def test_a_saved_dataset_directory_and_its_splits(tmp_path, datasets):
    rows = [{"question": f"What is {a} plus 3?", "answer": f"{a} + 3 = {a + 3}\n#### {a + 3}"} for a in range(5)]
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "gsm8k")
    tasks, problems = open_task_set(str(tmp_path / "gsm8k"))
    assert [t.answer for t in tasks.tasks] == ["3", "4", "5", "6", "7"] and not problems
    assert tasks.tasks[0].id == "gsm8k:1"

    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_list([{"problem": "Two?", "solution": "\\boxed{2}", "n": 1}]),
        "test": datasets.Dataset.from_list([{"problem": "Three?", "solution": "\\boxed{3}", "n": 2},
                                            {"problem": "Bad", "solution": "none", "n": 3}]),
    })
    splits.save_to_disk(tmp_path / "math")
    test, problems = open_task_set(f"{tmp_path / 'math'}:test", "id=n")
    assert test.tasks == (Task("2", MATH_TEMPLATE.format(problem="Three?"), "3"),) and test.name == "math:test"
    assert len(problems) == 1
    assert str(problems[0]).startswith(f"{tmp_path / 'math'}:test: row 2: ")
    with pytest.raises(TaskFileError, match="holds the splits 'train', 'test'; name one as .*math:SPLIT"):
        open_task_set(str(tmp_path / "math"))
    with pytest.raises(TaskFileError, match="no split 'dev' \\(it holds 'train', 'test'\\)"):
        open_task_set(f"{tmp_path / 'math'}:dev")
    with pytest.raises(TaskFileError, match="a split names a part of a dataset directory"):
        read_task_file(tmp_path / "x.jsonl", split="train")


def test_a_csv_file_and_a_folder_of_data_files_load_through_datasets(tmp_path, datasets):
    (tmp_path / "sums.csv").write_text("id,prompt,answer\n1,1+1=,2\n2,2+2=,4\n3,,6\n")
    tasks, problems = open_task_set(str(tmp_path / "sums.csv"))
    assert tasks.tasks == (Task("1", "1+1=", "2"), Task("2", "2+2=", "4"))
    assert len(problems) == 1 and str(problems[0]).startswith(f"{tmp_path / 'sums.csv'}: row 3: field 'prompt'")
    folder = tmp_path / "repo"
    folder.mkdir()
    lines(folder / "train.jsonl", [{"prompt": "3+3=", "answer": "6"}])
    assert open_task_set(str(folder))[0].tasks == (Task("repo:1", "3+3=", "6"),)


def test_what_datasets_cannot_load_is_one_error_naming_the_path(tmp_path, datasets):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "state.json").write_text("{not json")
    for spec in (tmp_path / "broken", tmp_path / "missing.csv"):
        with pytest.raises(TaskFileError, match=f"{spec}: cannot load with datasets"):
            open_task_set(str(spec))


# -- chat prompts ---------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "1+1="}]


def test_chat_messages_are_kept_canonical_and_hashed_as_messages(tmp_path):
    path = lines(tmp_path / "chat.jsonl", [
        {"id": "a", "prompt": MESSAGES, "answer": "2"},
        json.dumps({"answer": "2", "prompt": [{"content": m["content"], "role": m["role"]} for m in MESSAGES],
                    "id": "b"}, indent=None, separators=(" , ", " : ")),
        {"id": "c", "prompt": [{"role": "user", "content": "x", "name": "bob"}], "answer": "1"},
        {"id": "d", "prompt": [], "answer": "1"},
        {"id": "e", "prompt": [{"role": "", "content": "x"}], "answer": "1"},
    ])
    tasks, errors = read_task_file(path)
    assert [t.id for t in tasks] == ["a", "b"] and tasks[0].chat and tasks[0].prompt == tasks[1].prompt
    assert tasks[0].prompt == json.dumps(MESSAGES, separators=(",", ":"))
    assert is_held_out(tasks[0]) == is_held_out(tasks[1])  # one problem, one side of the split
    assert ["unknown key 'name'" in str(errors[0]), "non-empty list" in str(errors[1]),
            "'role' is empty" in str(errors[2])] == [True] * 3
    assert task_row(tasks[0]) == {"id": "a", "prompt": MESSAGES, "answer": "2"}  # reads back as itself


def generate_chat(tmp_path, model: str, key_file: str):
    """(task file, rollout file, its records): 2 groups of 2 on four chat tasks, by the CLI."""
    from vrl.rollouts.files import iter_records

    path = lines(tmp_path / "chat.jsonl", [{"id": f"t{i}", "prompt": [{"role": "user", "content": f"{i}+1="}],
                                            "answer": str(i + 1)} for i in range(4)])
    out = tmp_path / "chat.vrl"
    result = invoke("generate", "--model", model, "--task", path, "--key", key_file, "--out", str(out),
                    "--groups", "2", "--group-size", "2", "--max-new-tokens", "4")
    assert result.exit_code == 0, result.output
    return path, out, list(iter_records(out))


def test_chat_prompts_render_with_the_models_template_and_verify(tmp_path, chat_model, key_file):
    path, out, records = generate_chat(tmp_path, chat_model, key_file)
    model = load_model(chat_model)
    for record in records:
        assert record.prompt == f"<|user|>{record.task_id[1:]}+1=\n<|assistant|>"  # the rendering is the record's
        assert list(record.prompt_tokens) == model.encode(record.prompt)
    result = invoke("verify", str(out), "--model", chat_model, "--task", path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["accepted"] == len(records)
    # A verifier pinning the task set compares the rendering: a record of the raw JSON is rejected.
    tasks, _ = open_task_set(path)
    plain = TaskList("plain", tuple(Task(t.id, t.prompt, t.answer) for t in tasks.tasks))
    forged = generate(model, plain, NodeKey.load(key_file), round_seed=bytes(32), groups=1, group_size=2,
                      sampling=sampling_for(model, max_new_tokens=2))
    (verdict, _) = verify(forged, model, expect=Expectations(tasks=tasks))
    assert verdict.reason == "task_mismatch"


def test_a_clock_reading_chat_template_makes_records_that_verify_on_any_day(tmp_path, key_file):
    """A model whose template prints "Today Date" (Llama 3's) generates, and its records carry the
    pinned day's rendering, which a verifier on another day renders alike."""
    model = load_model("tiny")
    model.tokenizer.chat_template = DATED
    try:
        dated = str(model.save(tmp_path / "tiny-dated"))
    finally:
        model.tokenizer.chat_template = None  # the preset is cached: leave it as it was
    path, out, records = generate_chat(tmp_path, dated, key_file)
    assert records and all(r.prompt.startswith("Today Date: 26 Jul 2024\n<|user|>") for r in records)
    result = invoke("verify", str(out), "--model", dated, "--task", path, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["accepted"] == len(records), result.output


def both_sides(make_row, start: int = 0) -> list[dict]:
    """Rows ``make_row(i)``, i = start, start+1, ..., up to and including the first held-out one
    and at least one that is not: a task set a run can both train and evaluate on."""
    rows = []
    for i in range(start, start + 1000):
        rows.append(make_row(i))
        held = [is_held_out(t) for t in read_task_file_rows(rows)]
        if any(held) and not all(held):
            return rows
    raise AssertionError("no held-out row in 1000")


def read_task_file_rows(rows: list[dict]) -> list[Task]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        return read_task_file(lines(Path(folder) / "rows.jsonl", rows))[0]


def test_a_model_without_a_chat_template_is_a_clear_error_naming_the_task_set(tmp_path, key_file, chat_model):
    path = lines(tmp_path / "chat.jsonl", both_sides(lambda i: {"id": f"q{i}", "prompt": [{"role": "user",
                                                                 "content": f"{i}+1="}], "answer": str(i + 1)}))
    made = invoke("generate", "--model", chat_model, "--task", path, "--key", key_file,
                  "--out", str(tmp_path / "c.vrl"), "--groups", "1", "--group-size", "2", "--max-new-tokens", "2")
    assert made.exit_code == 0, made.output
    for command in (["generate", "--key", key_file, "--out", str(tmp_path / "r.vrl")],
                    ["train", "--out", str(tmp_path / "run")],
                    ["verify", str(tmp_path / "c.vrl")]):
        result = invoke(*command, "--model", "tiny", "--task", path)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert "chat.jsonl: task 'q0': its prompt is chat messages, but the model has no chat template" in \
            result.output


def test_a_template_that_reads_the_clock_sees_one_pinned_day_and_one_that_raises_is_refused_by_name(
        chat_model, monkeypatch):
    """Llama 3's templates print "Today Date" from transformers' strftime_now: pinned to
    TEMPLATE_CLOCK, a rendering is the same on every day, so its records verify later."""
    import datetime

    from transformers.utils import chat_template_utils

    from vrl.tasks.chat import prompt_text

    model = load_model(chat_model)
    task = Task("q", canonical_messages(MESSAGES), "2", chat=True)

    class Tokenizer:  # the tokenizer's template attribute and method, as a template of the Hub has them
        def __init__(self, template):
            self.chat_template = template

        def apply_chat_template(self, *args, **kwargs):
            return model.tokenizer.__class__.apply_chat_template(model.tokenizer, *args,
                                                                 chat_template=self.chat_template, **kwargs)

    dated = Tokenizer(DATED)
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert today != "26 Jul 2024"
    assert prompt_text(task, dated) == ("Today Date: 26 Jul 2024\n<|system|>Answer with a number.\n"
                                        "<|user|>1+1=\n<|assistant|>")
    assert prompt_text(task, Tokenizer("{{ strftime_now('%Y-%m-%d %H:%M') }}")) == "2024-07-26 00:00"
    assert chat_template_utils.datetime is datetime.datetime  # the clock is given back
    # Unpinned, the same template prints today's date: the pin is what makes it the same.
    unpinned = chat_template_utils._compile_jinja_template("{{ strftime_now('%d %b %Y') }}").render()
    assert unpinned in {today, datetime.datetime.now().strftime("%d %b %Y")}  # (midnight between)

    # Numbers and English names are spelled by vrl; what the C library spells by the machine's
    # locale or time zone is refused, as is what draws at random.
    assert prompt_text(task, Tokenizer("{{ strftime_now('%A %-d %B %Y, %j') }}")) == "Friday 26 July 2024, 208"
    for form in ("%s", "%c", "%Z", "%p"):
        with pytest.raises(ChatTemplateError, match=f"formats the date with {form}, which depends on the machine"):
            prompt_text(task, Tokenizer("{{ strftime_now('" + form + "') }}"))
    for template, what in [("{{ lipsum(1, False, 3, 5) }}", "calls lipsum()"),
                           ("{{ messages|random }}", "uses the random filter"),
                           ("{% if false %}{{ range(3)|random }}{% endif %}ok", "uses the random filter")]:
        with pytest.raises(ChatTemplateError, match=f"task 'q': the model's chat template {re.escape(what)}"):
            prompt_text(task, Tokenizer(template))

    with pytest.raises(ChatTemplateError, match="refused its messages: no system role"):
        prompt_text(task, Tokenizer("{{ raise_exception('no system role') }}"))
    # Threads render one at a time, each with the pinned clock, and the clock is given back.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda _: prompt_text(task, dated), range(16))) == {prompt_text(task, dated)}
    assert chat_template_utils.datetime is datetime.datetime
    # A transformers whose templates read the clock some other way: refused, not rendered.
    monkeypatch.setattr(chat_template_utils, "datetime", None)
    with pytest.raises(ChatTemplateError, match="task 'q': the model's chat template reads the clock"):
        prompt_text(task, dated)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=10)
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.text(max_size=6), JSON)},
                                optional={"name": JSON, "content": st.one_of(st.text(max_size=12), JSON)})


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(value=st.one_of(JSON, st.lists(st.one_of(MESSAGE, JSON), max_size=4)))
def test_any_messages_value_is_canonical_json_or_a_task_file_error(value):
    try:
        text = canonical_messages(value)
    except TaskFileError as error:
        assert str(error)
        return
    decoded = json.loads(text)
    assert decoded and all(list(m) == ["role", "content"] and m["role"] for m in decoded)
    assert canonical_messages(decoded) == text  # canonical: its own fixed point


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet="prompt=answerid,q =", max_size=30))
def test_any_columns_text_is_a_mapping_or_a_task_file_error(text):
    try:
        mapping = parse_columns(text)
    except TaskFileError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in mapping.items())


# Values a dataset's row can hold besides JSON's: bytes, timestamps, decimals, nested lists.
ARROW = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
                     | st.binary(max_size=8) | st.datetimes() | st.decimals(allow_nan=False),
                     lambda inner: (st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=8)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(row=st.dictionaries(st.sampled_from(["id", "prompt", "answer", "question", "problem", "solution", "q"]),
                           ARROW, max_size=5),
       columns=st.dictionaries(st.sampled_from(["prompt", "answer", "id"]), st.sampled_from(["q", "answer"]),
                               max_size=2))
def test_any_dataset_row_is_a_task_or_a_task_file_error(row, columns):
    from vrl.tasks.files import _mapped, _task

    try:
        task = _task(_mapped(row, columns), "d:1", "Q: {question}")
    except TaskFileError as error:
        assert str(error)
        return
    assert isinstance(task, Task) and all(isinstance(v, str) for v in (task.id, task.prompt, task.answer))


# -- max_new_tokens from the task set ------------------------------------------------------------

def gsm8k_rows(count: int, solution_bytes: int) -> list[dict]:
    """GSM8K rows whose worked solutions are ``solution_bytes`` long: one token a byte for the
    tiny preset's byte-level tokenizer."""
    rows = []
    for i in range(count):
        final = f"\n#### {i}"
        rows.append({"question": f"How many apples are in basket {i}?",
                     "answer": "x" * (solution_bytes - len(final)) + final})
    return rows


def test_the_default_length_comes_from_the_task_set():
    tiny = load_model("tiny")
    assert choose_max_new_tokens(tiny, open_task_set("arithmetic")[0])[0] == 8
    assert choose_max_new_tokens(tiny, open_task_set("arithmetic:digits=3,ops=+*,terms=3")[0])[0] == 11  # 997002999
    assert choose_max_new_tokens(tiny, open_task_set("arithmetic")[0], 5) == (5, "as set")
    listed = TaskList("free", (Task("a", "Say hi.", "hi"),))
    assert choose_max_new_tokens(tiny, listed)[0] == FREE_TEXT_MAX_NEW_TOKENS
    worked = TaskList("worked", tuple(Task(f"t{i}", "Q", "1", solution="y" * (100 if i < 99 else 3000))
                                      for i in range(100)))
    # The 99th percentile: the one 3000-token outlier does not set every group's length.
    assert choose_max_new_tokens(tiny, worked)[0] == 2 * LENGTH_STEP
    # Kept within the context after the longest prompt (tiny has 4096 positions).
    long = TaskList("long", (Task("a", "p" * 4000, "1", solution="z" * 500),))
    chosen, why = choose_max_new_tokens(tiny, long)
    assert chosen == 96 and "context of 4096" in why
    with pytest.raises(ValueError, match="task 'b' has a prompt of 5000 tokens, which leaves no room"):
        choose_max_new_tokens(tiny, TaskList("over", (Task("b", "p" * 5000, "1"),)))


def test_train_chooses_the_length_says_it_once_and_records_it(tmp_path, key_file):
    from vrl.rl.train import TrainConfig, Trainer

    path = lines(tmp_path / "gsm8k.jsonl", both_sides(lambda i: gsm8k_rows(i + 1, 40)[i]))
    run, logged = tmp_path / "run", []
    Trainer(TrainConfig(model="tiny", task=path, held_out=1), run, log=lambda event, **kw: logged.append((event, kw)))
    chosen = [kw for event, kw in logged if event == "max_new_tokens chosen from the task set"]
    assert len(chosen) == 1 and chosen[0]["max_new_tokens"] == LENGTH_STEP  # 40 and the stop token, up to 64
    assert "at most 40 tokens" in chosen[0]["why"]
    assert tomllib.loads((run / "config.toml").read_text())["max_new_tokens"] == LENGTH_STEP
    logged.clear()  # resumed: the value the run recorded, not chosen again
    resumed = Trainer(TrainConfig.from_saved(run / "config.toml"), run, resume=True,
                      log=lambda event, **kw: logged.append((event, kw)))
    assert resumed.sampling.max_new_tokens == LENGTH_STEP and not [e for e, _ in logged if "chosen" in e]
    # The CLI says it once, on stderr, as generate does.
    result = invoke("generate", "--model", "tiny", "--task", path, "--key", key_file, "--out", str(tmp_path / "g.vrl"),
                    "--groups", "1", "--group-size", "2")
    assert result.exit_code == 0, result.output
    assert result.output.count("max_new_tokens chosen from the task set") == 1 and "max_new_tokens=64" in result.output


def test_a_node_reads_a_dataset_with_columns_and_chooses_its_length(tmp_path, datasets):
    from p2p.loopback import LoopbackNetwork
    from vrl.node.config import NodeConfig
    from vrl.node.daemon import Node

    datasets.Dataset.from_list([{"q": row["question"], "sol": row["answer"]} for row in gsm8k_rows(20, 100)]
                               ).save_to_disk(tmp_path / "saved")
    key = NodeKey.generate()
    settings = NodeConfig(data_dir=str(tmp_path / "node"), trainer=key.node_id.hex(), transport="loopback",
                          work={"model": "tiny", "task": str(tmp_path / "saved"), "columns": "question=q,answer=sol"})
    node = Node(settings, LoopbackNetwork(seed=1).transport(key.private_seed()), key)
    try:
        assert len(node.tasks.tasks) == 20 and node.tasks.tasks[0].answer == "0"
        assert node.work.sampling.max_new_tokens == 2 * LENGTH_STEP  # 100 bytes and the stop token
    finally:
        node.store.close()


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(form=st.text(alphabet=st.sampled_from("%-dmYyHMSjbBaAcpszZ%e x\n\u00e9"), max_size=24)
       | st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=24))
def test_any_date_format_a_template_asks_for_is_spelled_alike_or_refused(form):
    """A template's strftime format is its author's: whatever it is, the pinned clock spells it
    without the C library, or names the directive it will not spell."""
    import datetime

    from vrl.tasks.chat import TEMPLATE_CLOCK, _MachineDependent, _PinnedInstant

    instant = _PinnedInstant(*TEMPLATE_CLOCK.timetuple()[:6])
    try:
        text = instant.strftime(form)
    except _MachineDependent as error:
        assert str(error).startswith("%") and str(error) in form
        return
    # As the C library spells it in the C locale, Python's default for dates (LC_TIME unset);
    # (NUL, which ends the C library's format, and lone surrogates it cannot take, left out).
    assert text == datetime.datetime.strftime(TEMPLATE_CLOCK, form)
