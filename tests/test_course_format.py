"""The course format: honest times for every notebook, twins in sync and linted, and for the notebooks in
the format ("format": "course" in helpers/manifest.json) a core lesson that fits its card, makes the learner
predict and act, and ends by pointing to its deep dive.

A notebook's estimate: words of markdown / 160, plus 1.8 x max(1, lines / 15) for each code cell, plus 3.5 for
each lab exercise (helpers.notebooks.estimated_minutes, fitted to learners' minutes: see the README).
"""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import manifest, notebooks
from helpers.notebooks import PREDICT_TAG, YOUR_TURN_TAG

REPO = Path(__file__).resolve().parent.parent
ITEMS = manifest.entries()
COURSE = [i for i in ITEMS if i.get("format") == "course"]
CORES = [i for i in COURSE if i["kind"] == "lesson" and "deep_dive_of" not in i]
MAX_CORE_MINUTES, MAX_START_MINUTES = 45, 20


def _nb(item):
    return notebooks.read(REPO / item["path"])


def _tagged(nb, tag):
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and tag in c.metadata.get("tags", [])]


def _readme_minutes() -> dict[str, int]:
    rows = re.findall(r"^\| \d\d \| \[[^\]]*\]\(([^)]+)\).*\| (\d+) min \|$", (REPO / "README.md").read_text(), re.M)
    return {path: int(minutes) for path, minutes in rows}


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i["id"])
def test_card_manifest_and_readme_state_at_least_the_estimate(item):
    nb = _nb(item)
    needed = math.ceil(notebooks.estimated_minutes(nb) - 1e-9)
    card = notebooks.card_minutes(nb)
    assert card is not None, "the card needs a '| **Time** | N minutes |' row"
    assert card >= needed, f"the card says {card} minutes, the estimate is {needed}"
    assert item["minutes"] == card, "helpers/manifest.json's minutes must be the card's"
    student = str(notebooks.student_path(Path(item["path"])).as_posix()) if item["kind"] == "lab" else item["path"]
    assert _readme_minutes().get(student) == card, \
        "the README table is stale: paste python -c \"from helpers.manifest import readme_table; print(readme_table())\""


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i["id"])
def test_twin_is_in_sync(item):
    assert notebooks.twin_problem(REPO / item["path"]) is None


def test_twins_and_helpers_pass_the_linter():
    twins = [str(notebooks.twin_path(i["path"])) for i in ITEMS]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *twins, "helpers", "tests"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("item", CORES, ids=lambda i: i["id"])
def test_core_lesson_fits_its_limit(item):
    limit = MAX_START_MINUTES if item["id"].startswith("00_") else MAX_CORE_MINUTES
    assert notebooks.estimated_minutes(_nb(item)) <= limit


def _assert_each_prediction_is_revealed(nb, prompts):
    """Each prompt assigns predict(...) to a name, and a later code cell reveals that name."""
    for i in prompts:
        found = re.search(r"^(\w+)\s*=\s*predict\(", nb.cells[i].source, re.M)
        assert found, f"cell {i}: a prediction prompt assigns predict(...) to a name"
        later = "\n".join(c.source for c in nb.cells[i + 1:] if c.cell_type == "code")
        assert re.search(rf"\breveal\(\s*{found.group(1)}\b", later), \
            f"cell {i}: no later cell reveals {found.group(1)} against the measurement"


@pytest.mark.parametrize("item", CORES, ids=lambda i: i["id"])
def test_core_lesson_asks_predictions_and_reveals_each(item):
    nb = _nb(item)
    prompts = _tagged(nb, PREDICT_TAG)
    assert len(prompts) >= 3, f"{len(prompts)} prediction prompts (cells tagged {PREDICT_TAG!r}), at least 3"
    _assert_each_prediction_is_revealed(nb, prompts)
    for i in prompts:
        assert notebooks.NBVAL_TAG not in nb.cells[i].metadata.get("tags", []), "a prediction depends on the machine"
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert prompts[0] <= code[len(code) // 2], "the first prediction comes in the first half of the lesson"


@pytest.mark.parametrize("item", CORES, ids=lambda i: i["id"])
def test_core_lesson_has_a_your_turn_that_is_checked(item):
    nb = _nb(item)
    turns = _tagged(nb, YOUR_TURN_TAG)
    assert turns, f"no cell tagged {YOUR_TURN_TAG!r}"
    after = [c.source for c in nb.cells[turns[0] + 1:] if c.cell_type == "code"]
    assert after and "your_turn(" in after[0], "the cell after a your-turn cell checks it with your_turn(...)"


DEEP_DIVES = [i for i in COURSE if i["kind"] == "lesson" and "deep_dive_of" in i]


@pytest.mark.parametrize("item", DEEP_DIVES, ids=lambda i: i["id"])
def test_deep_dive_has_the_learner_predict_and_act(item):
    """A deep dive is no reading: two predictions, each revealed later, and a your-turn that is checked."""
    nb = _nb(item)
    prompts = _tagged(nb, PREDICT_TAG)
    assert len(prompts) >= 2, f"{len(prompts)} prediction prompts (cells tagged {PREDICT_TAG!r}), at least 2"
    _assert_each_prediction_is_revealed(nb, prompts)
    turns = _tagged(nb, YOUR_TURN_TAG)
    assert turns, f"no cell tagged {YOUR_TURN_TAG!r}"
    assert any("your_turn(" in c.source for t in turns for c in nb.cells[t + 1:t + 3] if c.cell_type == "code"), \
        "a cell right after a your-turn cell checks it with your_turn(...)"


@pytest.mark.parametrize("item", [i for i in CORES if manifest.deep_dives(i["id"])], ids=lambda i: i["id"])
def test_core_lesson_ends_by_linking_its_deep_dives(item):
    nb = _nb(item)
    last = [c.source for c in nb.cells if c.cell_type == "markdown" and re.search(r"^## ", c.source, re.M)][-1]
    section = last[last.rindex("\n## ") + 1:] if "\n## " in last else last
    assert section.startswith("## Going further"), "the core's last section is '## Going further'"
    for deep in manifest.deep_dives(item["id"]):
        assert f"]({Path(deep['path']).name})" in section, f"'Going further' links {deep['path']}"
        assert (REPO / deep["path"]).exists()


def test_estimate_follows_the_formula():
    v4 = notebooks.nbformat.v4
    prompt = v4.new_code_cell("guess = predict('?', options=['a', 'b'], example='a')")
    prompt.metadata["tags"] = [PREDICT_TAG]
    exercise = v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n")
    nb = v4.new_notebook(cells=[v4.new_markdown_cell(" ".join(["word"] * 320)),
                                v4.new_code_cell("\n".join(["x = 1"] * 30)), v4.new_code_cell("y = 2"), prompt])
    assert notebooks.estimated_minutes(nb) == pytest.approx(320 / 160 + 1.8 * (30 / 15 + 1 + 1))
    nb.cells.append(exercise)
    assert notebooks.estimated_minutes(nb) == pytest.approx(320 / 160 + 1.8 * (30 / 15 + 1 + 1 + 1) + 3.5)
    nb.cells[0].source = "| **Time** | 12 minutes |"
    assert notebooks.card_minutes(nb) == 12


def test_twin_round_trip_keeps_ids_and_stored_outputs():
    v4 = notebooks.nbformat.v4
    checked = v4.new_code_cell("print(1)", execution_count=1, outputs=[v4.new_output("stream", text="1\n")])
    checked.metadata["tags"] = [notebooks.NBVAL_TAG]
    nb = notebooks.normalize(v4.new_notebook(cells=[v4.new_markdown_cell("# T"), checked, v4.new_code_cell("a = 1")]))
    text = notebooks.twin_text(nb)
    assert '# %% tags=["nbval-check-output"]' in text and "# # T" in text
    edited = notebooks.from_twin(text.replace("a = 1", "a = 2"), nb)
    assert [c.id for c in edited.cells] == [c.id for c in nb.cells], "ids survive, the edited cell's too"
    assert edited.cells[1].outputs == nb.cells[1].outputs, "an unchanged checked cell keeps its stored output"
    assert edited.cells[2].source == "a = 2"
