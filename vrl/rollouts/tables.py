"""How verification's verdicts read on a terminal: the table ``vrl verify`` prints, and the
demo (vrl.harness.demo) with it. Light: rich only, so ``vrl --help`` imports it without torch."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from vrl.rollouts.verify import Verdict


def verdict_table(verdicts: Iterable[Verdict], title: str = "verification") -> Group:
    """The verdicts as a table readable at 80 columns (every header and reason code whole; the
    task, the one free text, takes what is left and wraps), then each rejection's stage and
    sentence on a line of its own below it, where it has the whole width."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                  show_edge=False)
    for column in ("#", "node", "task", "sample", "verdict", "reason"):
        # Only the task wraps, so rich narrows it alone. The rest are at most 53 columns with
        # their gaps (the longest reason code, sampling_params_mismatch, is 24 characters), which
        # leaves an arithmetic task id's 27 at 80 columns.
        table.add_column(column, no_wrap=column != "task", overflow="fold", min_width=len(column))
    details = []
    for v in verdicts:
        mark = "[green]accepted[/]" if v.accepted else "[red]rejected[/]"
        # Task ids and messages come from records: text, never markup (a "[/x]" would raise).
        table.add_row(str(v.index), v.node_id[:8], escape(v.task_id), str(v.sample_index) if v.sample_index >= 0
                      else "", mark, "" if v.accepted else v.reason)
        if not v.accepted:
            details.append(Text(f"{v.index} ({v.stage.name.lower()}): {v.message}"))
    return Group(table, *details)
