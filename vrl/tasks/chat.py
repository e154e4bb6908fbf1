"""Chat prompts: a task whose prompt is a list of ``{"role", "content"}`` messages.

Such a task's :attr:`~vrl.tasks.Task.prompt` is the *canonical JSON* of its messages
(:func:`canonical_messages`): what its identity and its held-out hash cover, whatever model
renders it (specs/tasks.md §4.2). The text a model is given, and whose tokens a record binds, is
the rendering of those messages with the model's own chat template (:func:`prompt_text`): one
function of (messages, tokenizer), used by the generator and by every verifier alike, so a
verifier with the same model derives the same text and tokens.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from vrl.errors import shown
from vrl.tasks.core import Task, TaskFileError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Keys a message may have: its role and its text. A template reads other keys (tool calls,
#: names) that a task's prompt has no use for; dropping one silently would change the prompt.
MESSAGE_KEYS = ("role", "content")
#: What a chat template that reads the clock is shown (transformers gives templates
#: ``strftime_now``; Llama 3's print "Today Date: ..."): one instant, so that the rendering is a
#: function of the messages alone, on every machine and every day (specs/tasks.md §4.2). The
#: date is the one Llama 3.1's own template prints where it is given no clock.
TEMPLATE_CLOCK = datetime.datetime(2024, 7, 26)
#: The strftime directives it is formatted with, each spelled here and never by the C library,
#: whose names follow the machine's locale and whose %s, %z, %Z and %c its time zone (specs/
#: tasks.md §4.2); ``-`` (glibc's "no padding") may precede a number's.
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NUMBERS = {"d": ("day", 2), "m": ("month", 2), "Y": ("year", 4), "H": ("hour", 2), "M": ("minute", 2),
            "S": ("second", 2)}
_DIRECTIVE = re.compile(r"%(-?)(.)", re.DOTALL)
# The pinned clock is transformers' module attribute while a template renders: one at a time.
_CLOCK_LOCK = threading.Lock()


class ChatTemplateError(TaskFileError):
    """A chat task that a model cannot render: it has no chat template, or its template
    refuses the messages."""


def canonical_messages(value: Any, field: str = "prompt") -> str:
    """``value`` (a row's decoded field) checked as a non-empty list of messages, as canonical
    JSON: ``[{"role": ..., "content": ...}, ...]``, keys in that order, no spaces, non-ASCII
    characters as they are. Raises :class:`TaskFileError` naming what is wrong, and nothing else."""
    if not isinstance(value, list) or not value:
        raise TaskFileError(f"field {field!r}: chat messages must be a non-empty list")
    messages = []
    for index, message in enumerate(value):
        where = f"field {field!r}, message {index + 1}"
        if not isinstance(message, dict):
            raise TaskFileError(f"{where}: expected an object with 'role' and 'content'")
        if extra := [key for key in message if key not in MESSAGE_KEYS]:
            raise TaskFileError(f"{where}: unknown key {str(extra[0])[:40]!r} (a message has only "
                                f"{' and '.join(map(repr, MESSAGE_KEYS))})")
        for key in MESSAGE_KEYS:
            text = message.get(key)
            if not isinstance(text, str):
                raise TaskFileError(f"{where}: {key!r} missing or not a string")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskFileError(f"{where}: {key!r} is not valid Unicode (a lone surrogate)") from None
        if not message["role"]:
            raise TaskFileError(f"{where}: 'role' is empty")
        messages.append({key: message[key] for key in MESSAGE_KEYS})
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":"))


def messages_of(task: Task) -> list[dict[str, str]]:
    """A chat task's messages, as a template takes them."""
    messages: list[dict[str, str]] = json.loads(task.prompt)  # canonical_messages' JSON
    return messages


def prompt_text(task: Task, tokenizer: PreTrainedTokenizerBase) -> str:
    """The text a model is given for ``task``, whose tokens (the tokenizer's encoding, no
    special tokens added: :meth:`vrl.rollouts.model.Model.encode`) a record binds: the prompt
    itself, or a chat task's messages rendered with the tokenizer's chat template and the
    generation prompt (the opening of the assistant's turn). Raises :class:`ChatTemplateError`
    when that cannot be done, naming the task."""
    if not task.chat:
        return task.prompt
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ChatTemplateError(f"task {shown(task.id)}: its prompt is chat messages, but the model has no chat "
                                "template (the tokenizer's chat_template); use a chat model, or prompts as text")
    if problem := _chance_in(str(template)):
        raise ChatTemplateError(f"task {shown(task.id)}: the model's chat template {problem}, so no two machines "
                                "render the same prompt; vrl needs a template that is a function of the messages alone")
    try:
        # A rendering that changed at midnight would fail every later verification of its records.
        with _pinned_clock(task) if "strftime_now" in str(template) else contextlib.nullcontext():
            text = tokenizer.apply_chat_template(messages_of(task), tokenize=False, add_generation_prompt=True)
    except ChatTemplateError:
        raise
    except _MachineDependent as error:
        raise ChatTemplateError(f"task {shown(task.id)}: the model's chat template formats the date with {error}, "
                                "which depends on the machine's locale or time zone") from None
    except Exception as error:  # a template's raise_exception, or any error of its code: named, not a traceback
        raise ChatTemplateError(f"task {shown(task.id)}: the model's chat template refused its messages: "
                                f"{str(error)[:200]}") from None
    if not isinstance(text, str) or not text:
        raise ChatTemplateError(f"task {shown(task.id)}: the model's chat template rendered no text")
    return text


@functools.lru_cache(maxsize=16)
def _chance_in(template: str) -> str | None:
    """What in ``template`` draws at random (Jinja's ``lipsum()`` and ``|random``), or None:
    found in its syntax tree, as transformers parses it, whether or not a rendering reaches it."""
    from jinja2 import nodes
    from transformers.utils import chat_template_utils as templates

    try:
        tree = templates._compile_jinja_template(template).environment.parse(template)
    except Exception:  # not Jinja: the rendering that follows fails and says why, as for any broken template
        return None
    if any(node.name == "lipsum" for node in tree.find_all(nodes.Name)):
        return "calls lipsum(), which writes random text"
    if any(node.name == "random" for node in tree.find_all(nodes.Filter)):
        return "uses the random filter"
    return None


class _MachineDependent(Exception):
    """A strftime directive that the pinned clock does not spell itself (its message)."""


class _PinnedInstant(datetime.datetime):
    """TEMPLATE_CLOCK, formatted by :meth:`strftime` alike on every machine."""

    def strftime(self, form: str) -> str:
        def one(match: re.Match[str]) -> str:
            plain, directive = match.group(1) == "-", match.group(2)
            if directive in _NUMBERS:
                name, width = _NUMBERS[directive]
                value = getattr(self, name)
                return str(value) if plain else f"{value:0{width}d}"
            if plain:
                raise _MachineDependent(f"%-{directive}")
            spelled = {"%": "%", "y": f"{self.year % 100:02d}", "j": f"{self.timetuple().tm_yday:03d}",
                       "b": _MONTHS[self.month - 1][:3], "B": _MONTHS[self.month - 1],
                       "a": _DAYS[self.weekday()][:3], "A": _DAYS[self.weekday()]}
            if directive not in spelled:
                raise _MachineDependent(f"%{directive}")
            return spelled[directive]

        return _DIRECTIVE.sub(one, str(form))


@contextlib.contextmanager
def _pinned_clock(task: Task) -> Iterator[None]:
    """transformers' clock for templates (``strftime_now`` reads its module's ``datetime``)
    stopped at TEMPLATE_CLOCK while a template renders. A transformers whose templates read the
    clock another way cannot be pinned, and its clock-reading templates are refused."""
    from transformers.utils import chat_template_utils as templates

    class Pinned(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
            # transformers asks for local time; every machine is given the same instant, a
            # _PinnedInstant rather than a Pinned (datetime's stub says now() returns Self)
            return _PinnedInstant(*TEMPLATE_CLOCK.timetuple()[:6])

    with _CLOCK_LOCK:
        clock = getattr(templates, "datetime", None)
        if clock is not datetime.datetime:
            raise ChatTemplateError(f"task {shown(task.id)}: the model's chat template reads the clock (strftime_now), "
                                    "and this transformers version's clock cannot be pinned, so another day would "
                                    "render another prompt; use a template that is a function of the messages alone")
        templates.datetime = Pinned  # type: ignore[attr-defined]  # transformers imports datetime, not re-exported
        try:
            yield
        finally:
            templates.datetime = clock  # type: ignore[attr-defined]  # as above
