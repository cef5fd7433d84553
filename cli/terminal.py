"""What the ``unihub`` command prints, made safe for a terminal.

A dataset's names and values reach the terminal in what the commands print: field and schema names,
version tags, file names, the values an error message quotes. A terminal obeys the control
characters among them (``ESC ]0;...BEL`` retitles the window, ``ESC [2J`` clears the screen, ``CR``
hides what came before on the line), so a dataset from elsewhere could drive it. Every control
character but newline and tab is printed as its ``\\xNN`` escape instead: in the command's standard
output (:class:`PrintableStream`, for the whole command) and in its error and warning lines
(:func:`printable`). Progress displays write to standard error directly, with their own ``\\r``. A
character the standard output's encoding cannot hold is printed as its ``\\uXXXX`` escape, as Python
writes standard error, instead of ending the command with a ``UnicodeEncodeError``.
"""

from __future__ import annotations

from typing import Any, TextIO

#: C0 controls but newline and tab, DEL and the C1 controls -> their escapes
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) not in "\n\t"}


def printable(text: str) -> str:
    """``text`` with its control characters (but newline and tab) written as ``\\xNN`` escapes."""
    return text.translate(_ESCAPES)


class PrintableStream:
    """A text stream that writes :func:`printable` text into ``stream`` (and is ``stream`` otherwise)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        shown = printable(text)
        encoding = getattr(self.stream, "encoding", None)
        if encoding:  # what the terminal's encoding lacks (a field named in Cyrillic, under Latin-1) as \uXXXX
            shown = shown.encode(encoding, "backslashreplace").decode(encoding)
        self.stream.write(shown)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
