"""Text from models and documents on its way to the terminal: never markup, never a control sequence."""

import os
import unicodedata

from rich.console import Console
from rich.text import Text


def printable(text: str, limit: int = 200) -> str:
    """``text`` with control, format and unassigned characters written as escapes (``\\x1b``, ``\\u202e``) and cut
    to ``limit`` characters, so a name cannot clear the screen, move the cursor or reorder what is shown."""
    text = text if len(text) <= limit else text[:limit] + "…"
    return "".join(c if unicodedata.category(c)[0] not in "CZ" or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plain(text: str, limit: int = 200) -> Text:
    """A table cell or title that rich prints as is (``[/x]`` is text, not a closing tag)."""
    return Text(printable(text, limit))


def stdout_console() -> Console:
    """The console commands print results on: the terminal's width, else ``COLUMNS`` or 200 when piped."""
    width = None if Console().is_terminal else int(os.environ.get("COLUMNS", "200") or 200) if os.environ.get(
        "COLUMNS", "").isdigit() else 200
    return Console(width=width)
