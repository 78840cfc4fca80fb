"""Showing a stream's events: one JSON object a line, or text on a terminal (confirmed text plain, the
hypothesis after it dim, rewritten in place)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from typing import TextIO

from .events import StreamEvent

DIM, RESET, CLEAR_LINE = "\033[2m", "\033[0m", "\r\033[K"


class JsonLines:
    def __init__(self, out: TextIO):
        self.out = out

    def show(self, events: Iterable[StreamEvent]) -> None:
        for event in events:
            self.out.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
        self.out.flush()


class PlainText:
    """Confirmed text only, as it is confirmed (output that is not a terminal)."""

    def __init__(self, out: TextIO):
        self.out = out

    def show(self, events: Iterable[StreamEvent]) -> None:
        for event in events:
            if event.type == "confirmed":
                self.out.write(event.text)
            elif event.type == "done":
                self.out.write("\n")
        self.out.flush()


class Terminal:
    """The current line's confirmed text, then the hypothesis dim; a line that fills the terminal is kept and
    a new one begun, so that rewriting in place never spans two rows."""

    def __init__(self, out: TextIO):
        self.out = out
        self.line = ""
        self.hypothesis = ""

    def show(self, events: Iterable[StreamEvent]) -> None:
        for event in events:
            if event.type == "confirmed":
                self.line = (self.line + event.text).lstrip()
            elif event.type == "hypothesis":
                self.hypothesis = event.text if self.line else event.text.lstrip()
            elif event.type == "done":
                self.hypothesis = ""
        width = max(20, shutil.get_terminal_size().columns - 1)
        while len(self.line) > width - 10:
            cut = self.line.rfind(" ", 0, width) if len(self.line) > width else len(self.line)
            cut = cut if cut > 0 else width
            self.out.write(CLEAR_LINE + self.line[:cut] + "\n")
            self.line = self.line[cut:].lstrip()
        room = width - len(self.line)
        tail = self.hypothesis if len(self.hypothesis) <= room else self.hypothesis[: max(0, room - 1)] + "…"
        self.out.write(CLEAR_LINE + self.line + DIM + tail + RESET)
        if any(e.type == "done" for e in events):
            self.out.write("\n")
            self.line = ""
        self.out.flush()
