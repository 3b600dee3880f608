"""Each lab's harnesses, one module per lab: the functions its cases name (`Case.call`) that build what
cannot travel to the sandbox as tensors (a generator, a model, a file path) and measure what a returned
value cannot show (FLOPs, host reads, threads, saved activations), and the objects its notebook imports.
They run in the learner's process, so nothing here may hold a reference answer (those are in
helpers/grading/specs/, which the sandbox does not see). Harnesses every lab may use are in
helpers/grading/checks.py."""
from helpers import capstone, capstone_timing, memory
from helpers.ext import lab as ext_lab
from helpers.validation import workloads
from helpers.grading.harnesses import lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10

MODULES = (lab00, lab01, lab02, lab03, lab04, lab05, lab06, lab07, lab08, lab09, lab10)
MEASURING = (capstone, capstone_timing, memory, ext_lab, workloads)   # course modules a harness measures with
                                                                        # (workloads: the capstone's clock): watched
