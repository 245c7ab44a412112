"""The CLI's rich consoles: what they print is text, never markup.

Names, descriptions, reasons, paths, labels and worker reports are users' own strings, and rich
reads markup in every string it prints, table cells included: `[/x]` in a suite's description
was a closing tag with nothing open (`suite show` crashed), `[link=...]` would be a link,
`:smile:` an emoji. So every console is made here with markup and emoji codes off, and styles
come as `Text` pieces (`bold`, `styled`), never as tags inside a string.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def console(*, stderr: bool = False) -> Console:
    return Console(stderr=stderr, markup=False, emoji=False)


def styled(value: object, style: str) -> Text:
    return Text(str(value), style=style)


def bold(value: object) -> Text:
    return styled(value, "bold")


def line(*parts: str | Text) -> Text:
    """One printed line of plain strings and styled pieces."""
    return Text.assemble(*parts)
