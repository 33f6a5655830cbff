"""Bounded capture and cleaning of terminal text."""

from __future__ import annotations

from prorl_async.toolserver._text import CappedText, cap_text, clean_terminal_text


def test_capped_text_keeps_bounded_head_and_tail() -> None:
    sink = CappedText(1000)
    for i in range(100_000):
        sink.append(f"{i}\n")
    assert len(sink) == sum(len(f"{i}\n") for i in range(100_000))
    out = sink.text(200, str)
    assert out.startswith("0\n1\n2\n") and out.endswith("99998\n99999\n")
    head, _, tail = out.partition("\n[... ")
    assert len(head) == 100 and len(tail.split("omitted ...]\n", 1)[1]) == 100


def test_drop_suffix_spans_tail_and_head() -> None:
    sink = CappedText(5)
    sink.append("abcdefgh")
    sink.drop_suffix(4)
    assert sink.text(100, str) == "abcd"


def test_cap_text_marks_what_it_omits() -> None:
    assert cap_text("x" * 10, 10) == "x" * 10
    assert (
        cap_text("a" * 5 + "b" * 10 + "c" * 5, 10)
        == "aaaaa\n[... 10 characters omitted ...]\nccccc"
    )


def test_clean_terminal_text() -> None:
    raw = "\x1b[32mok\x1b[0m\r\nprogress 10%\rprogress 100%\r\n\x1b]0;t\x07done\x07"
    assert clean_terminal_text(raw) == "ok\nprogress 100%\ndone"
