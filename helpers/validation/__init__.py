"""The migration / performance validation pipeline.

Four baseline workloads with random weights (`workloads`: ResNet-50 training, a BERT-base-shaped encoder
over padded vs jagged batches, a DLRM-style model with an MoE top run by grouped_mm, a UNet step with
self-attention), four upgrade checks (`upgrade`: quantization accuracy, a custom op under opcheck, AMP
bf16 numerics, a 2-process gloo DDP step), and `pipeline`: one JSON per run, a comparison of two runs.

    python -m helpers validate run --quick --out a.json
    python -m helpers validate compare a.json b.json --out report.html
"""
from helpers.validation.pipeline import (chart, compare_runs, load_run, run_pipeline, save_run, table,
                                         write_report)

__all__ = ["benchmark", "chart", "compare_runs", "load_run", "run_pipeline", "save_run", "table", "write_report"]


def benchmark(quick: bool = False) -> dict:
    """`python -m helpers bench validation`: one run of the pipeline, as JSON."""
    return run_pipeline(quick=quick)
