"""No number in a lesson's prose that the lesson did not measure or cite.

A figure with a unit (5x, 43%, 12 ms, 900 GB/s, 4 GB, ...) in a markdown cell must carry its source in
its paragraph or list item: a link, a PR or issue number (#12345), the source file it is read from, or be marked as an example ("e.g.",
"for example"). A figure in "double quotes" is a quotation (an article's claim the lesson examines) and
one in `code` is code. Figures measured by the notebook belong in its printed output, where they are
computed on the machine that runs it. See "Adding a lesson" in the README.
"""
import json
import re

import pytest

from helpers import manifest

FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?\s?"
                    r"(?:x|×|%|ms|us|µs|ns|s|GB/s|TB/s|MB/s|GFLOP/s|TFLOP/s|KB|MB|GB|TB|KiB|MiB|GiB)(?![\w/])")
SOURCED = re.compile(r"https?://|\]\(|(?<![\w&])#\d{3,}|\be\.g\.|\bfor example\b"
                     r"|\b[\w/]+\.(?:py|cpp|cu|h|hpp|yaml)\b", re.I)       # ... or the source file it is read from
NOT_STATED = re.compile(r"`[^`]*`|\"[^\"]*\"|“[^”]*”")       # code and quotations
FENCED = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.S | re.M)   # a fenced code block is code too
BLOCK_START = re.compile(r"^\s*$|^\s*(?:[-*] |\d+\. |#|\|)")      # a new paragraph, list item, heading, row


def _blocks(markdown: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in markdown.splitlines():
        if not blocks or BLOCK_START.match(line):
            blocks.append([])
        if line.strip():
            blocks[-1].append(line)
    return blocks


def unsourced_figures(markdown: str) -> list[str]:
    """The lines whose figures have no source in their paragraph or list item."""
    found = []
    for block in _blocks(FENCED.sub("", markdown)):
        text = " ".join(block)
        if SOURCED.search(text):
            continue
        found += [line.strip() for line in block if FIGURE.search(NOT_STATED.sub("", line))]
    return found


def test_the_rule_catches_a_typed_figure_and_accepts_a_cited_one():
    assert unsourced_figures("On our machine it was 8x (M = 16) to 30x faster.")
    assert unsourced_figures("a 2 GB model loads in 9 s")
    assert not unsourced_figures("43% faster on average (https://pytorch.org/get-started/pytorch-2.0)")
    assert not unsourced_figures("fixed by #168382, which made it 2x faster")
    assert not unsourced_figures("e.g. 4.8 TB/s on an H200")
    assert not unsourced_figures("sm_90, Python 3.13t, a 2x2 tile, `min_run_time=0.02 s` and torch 2.10")
    assert not unsourced_figures('the article\'s "5-15% overhead" is not measured anywhere')
    assert not unsourced_figures("PyTorch's page reports 43% faster\ntraining (https://pytorch.org/blog)")
    assert unsourced_figures("- a cited item (#1234)\n- an item that is 3x faster")
    assert not unsourced_figures("```python\nlocal_pid = pid // 3   # grid: 3 x the blocks\n```")
    assert unsourced_figures("```python\nx = 1\n```\nand then it was 3x faster")


LESSONS = [e for e in manifest.entries() if e["kind"] == "lesson"]


@pytest.mark.parametrize("entry", LESSONS, ids=[e["id"] for e in LESSONS])
def test_every_figure_in_a_lesson_is_measured_or_cited(entry):
    cells = json.loads((manifest.REPO / entry["path"]).read_text())["cells"]
    found = [f"cell {i}: {line}" for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             for line in unsourced_figures("".join(c["source"]))]
    assert not found, "figures with a unit and no source (print them from a cell, or cite them):\n" + "\n".join(found)
