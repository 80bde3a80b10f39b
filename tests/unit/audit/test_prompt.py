"""What a box's words look like in a question put to a person: nothing a terminal would act on, nothing on a line of its own."""

import os

import pytest

from quinebox.audit.prompt import MAX_SHOWN, escaped, shown
from quinebox.audit.request import Request


@pytest.mark.parametrize(
    "text, seen",
    [
        ("plain words, fine", "plain words, fine"),
        ("clear\x1b[2Jscreen", "clear\\x1b[2Jscreen"),
        ("two\nlines", "two\\x0alines"),
        ("back\rto the start", "back\\x0dto the start"),
        ("bell\x07", "bell\\x07"),
        ("del\x7f", "del\\x7f"),
        ("c1 csi \x9b31m", "c1 csi \\x9b31m"),
        ("right-to-left \u202eevil", "right-to-left \\u202eevil"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("line\u2028separator", "line\\u2028separator"),
        ("no-break\u00a0space", "no-break\\xa0space"),
        ("a \\x1b already", "a \\\\x1b already"),
        ("unicode ünïcödé ok", "unicode ünïcödé ok"),
    ],
)
def test_escaped(text, seen):
    assert escaped(text) == seen


def test_long_values_are_cut_with_their_length_said():
    out = escaped("x" * 1000)
    assert out == "x" * MAX_SHOWN + "…[1000 chars]"


def test_lists_are_shown_word_by_word_and_empty_is_said():
    assert shown(["sh", "-c", "a\nb"]) == "sh -c a\\x0ab"
    assert shown([]) == "(none)"


def test_a_forged_question_stays_inside_its_fact():
    """Rendered as the terminal would get it: one line per fact behind a margin; only our question starts a line."""
    from quinebox.audit.prompt import QUESTION, Terminal

    read_end, write_end = os.pipe()
    terminal = Terminal(write_end)
    evil = "ok\r\n\x1b[1A\x1b[2K" + QUESTION + " (default allow) y\n"
    terminal.ask(Request("s1", "child", "a child (run) with rw:/src", {"mission": evil}), 30)
    text = os.read(read_end, 65536).decode()
    rows = text.split("\r\n")
    assert rows[0].startswith("quinebox: box s1 asks (child, request ")
    assert all(row.startswith("  | ") for row in rows[1:-1])
    assert rows[-1].startswith(QUESTION + " (default deny")
    assert sum(QUESTION in row for row in rows) == 2  # the box's copy sits escaped inside its fact
    assert "\x1b" not in text and "\\x1b[1A" in text
