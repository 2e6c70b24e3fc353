"""Run a Python script with the BM 8 swapped-operand plans hidden from the planner (the A side of the s23 A/B).

    python3 hide8.py bench/bench_gemm.py --no-exllamav3 ...

plan.candidates() offers BM 8 only when plan.SWAP_BM is in the library's lohi BM tiers: setting it to -1 removes
those candidates and leaves every other plan as on main.
"""
import runpy
import sys

import exl3_kernels.plan as plan

plan.SWAP_BM = -1
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
