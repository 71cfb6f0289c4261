"""PBT on the PBT paper's toy: exploit and explore find what neither fixed member can."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks_path import BENCHMARKS  # noqa: F401  (puts benchmarks/ on sys.path)
from pbt_toy import run_fixed, run_pbt

REPO = Path(__file__).resolve().parents[1]


def test_pbt_reaches_the_optimum_that_fixed_members_miss():
    pbt, fixed = run_pbt("local"), run_fixed("local")
    assert pbt.best["Q"] >= 1.15
    assert fixed.best["Q"] <= 0.40
    frame = pbt.dataframe()
    exploits = frame[frame.donor_id.notna()]
    assert len(exploits) >= 2 and (exploits.step % 10 == 0).all()


def test_benchmark_last_line():
    out = subprocess.run([sys.executable, "benchmarks/pbt_toy.py"], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["pbt_best_q"] >= 1.15 and summary["fixed_h_best_q"] <= 0.40 and summary["exploits"] >= 2
