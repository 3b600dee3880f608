"""The migration / performance validation pipeline.

Four workloads the 2.10 article names, with random weights and quick/full sizes (`workloads`: ResNet-50
training throughput, BERT-base-style inference latency over variable lengths, DLRM with EmbeddingBag
tables and a mixture-of-experts top, a Stable-Diffusion-style UNet with cross-attention), four upgrade
checks (`upgrade`: PTQ accuracy on scikit-learn's digits, a compiled C++ extension, AMP with scaled_mm,
DDP gradients), the paths that differ between torch releases (`compat`), reference outputs for the
numerics check (`reference`), the noise statistic (`stats`), one JSON per run and a comparison that
refuses mismatched runs (`pipeline`), and the two-environment driver (`matrix`).

    python -m helpers validate run --quick --out a.json
    python -m helpers validate compare a.json b.json --out report.html
    python -m helpers validate matrix 2.9.1 2.10.0 --quick          # make validate-matrix
    python -m helpers validate plan a.json b.json                   # rounds each change needs at this noise
"""
from helpers.validation.pipeline import (NotComparable, chart, compare_runs, load_run, merge_runs, plan, plan_text,
                                         run_pipeline, save_run, table, write_report)

__all__ = ["NotComparable", "benchmark", "chart", "compare_runs", "load_run", "merge_runs", "plan", "plan_text",
           "run_pipeline", "save_run", "table", "write_report"]


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench validation`: one run of the pipeline, as JSON (reference tensors left out)."""
    run = run_pipeline(quick=quick)
    for result in run["workloads"].values():
        result.pop("_tensors", None)
    return run
