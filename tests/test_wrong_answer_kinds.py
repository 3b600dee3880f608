"""Each kind of mistake, made by one factory (tests/wrong_answers.py), fails every exercise whose spec checks
the property it breaks, with that case's hint: the solution notebook's right function, turned into the
mistake, loses the case the right function passes. Which exercises a kind applies to is read from the specs
(the harness a case calls, a case that expects an error message naming something), so a new exercise
checking one of these properties is covered without a new row."""
from __future__ import annotations

import pytest
import torch

from helpers.grading.specs import SPECS
from wrong_answers import (MATCH_HINT, SEED, collects_before_yielding, does_the_work_twice,
                           draws_from_the_global_generator, exercise_of, message_without_the_fix, reads_back_to_the_host,
                           returns_another_dtype, run_cases, solution_namespace, writes_into_a_shared_buffer)

# the harness a case calls -> the factory whose mistake that case is there to catch
BY_HARNESS = {
    "host_reads_of": reads_back_to_the_host,
    "grouped_gemm_flops": does_the_work_twice,
    "expert_ffn_flops": does_the_work_twice,
    "global_rng_use": draws_from_the_global_generator,
    "globals_written": writes_into_a_shared_buffer,
    "read_ahead": collects_before_yielding,
    "dtype_of": lambda fn: returns_another_dtype(fn, None),
    "dtype_of_first": lambda fn: returns_another_dtype(fn, 0),
    "dtype_of_second": lambda fn: returns_another_dtype(fn, 1),
    "offsets_dtype": lambda fn: returns_another_dtype(fn, 1),
    "dtype_of_third": lambda fn: returns_another_dtype(fn, 2),
}
KIND_OF = {"host_reads_of": "host read", "grouped_gemm_flops": "FLOPs", "expert_ffn_flops": "FLOPs",
           "global_rng_use": "global generator", "globals_written": "shared state", "read_ahead": "streaming"}


def applicable() -> list:
    """(lab, function, case name, factory), one per exercise and kind (in the id): the first case of that
    kind, a visible one where there is."""
    rows, seen = [], set()
    for lab, spec in SPECS.items():
        for exercise in spec.exercises if spec.submission is None else ():   # the capstone: test_capstone*.py
            cases = exercise.cases(torch.Generator().manual_seed(SEED))
            for case in sorted(cases, key=lambda c: c.hidden):      # a visible case first: check() shows it
                if case.call in BY_HARNESS:
                    kind, factory = KIND_OF.get(case.call, "dtype"), BY_HARNESS[case.call]
                elif case.raises and case.match:
                    kind, factory = "error message", message_without_the_fix
                else:
                    continue
                if (lab, exercise.function, kind) not in seen:
                    seen.add((lab, exercise.function, kind))
                    rows.append(pytest.param(lab, exercise.function, case.name, factory,
                                             id=f"{lab[:2]}-{exercise.function}-{kind.replace(' ', '-')}"))
    return rows


ROWS = applicable()


def test_every_kind_applies_somewhere():
    """The specs still check each property a factory breaks (a renamed harness would silently drop a kind)."""
    kinds = {row.id.split("-", 2)[2] for row in ROWS}
    assert {"host-read", "FLOPs", "global-generator", "shared-state", "streaming", "dtype", "error-message"} <= kinds, \
        kinds
    assert len(ROWS) >= 15, [row.id for row in ROWS]


@pytest.mark.parametrize("lab, function, case, factory", ROWS)
def test_the_mistake_fails_the_case_that_checks_it(lab, function, case, factory):
    right = solution_namespace(lab)[function]
    assert run_cases(lab, right, function, only=(case,)) == [], "the right function fails the case itself"
    failed = dict(run_cases(lab, factory(right), function, only=(case,)))
    assert case in failed, f"{case!r} passed the mistake"
    spec_case = next(c for c in exercise_of(lab, function).cases(torch.Generator().manual_seed(SEED))
                     if c.name == case)
    assert (MATCH_HINT if spec_case.raises else spec_case.hint) in failed[case], failed[case]
    assert not spec_case.hidden, "the notebook's check() does not show this mistake: only a hidden case catches it"
