"""A standby engine process imports torch and the engine's modules at the lowest priority, and the
threads that later compute for its engine run at the engine's."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import json, os, sys
from lmiserve.rolling_batch.process import standby_process

def nice_of(tid):
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])

before = "torch" in sys.modules
thread, tid = standby_process.import_ahead("LlamaForCausalLM")
import_nice = nice_of(tid)
thread.join()
by_imports = "torch" in sys.modules
import torch

idle = set(os.listdir("/proc/self/task"))
torch.set_num_threads(2)
x = torch.randn(256, 256)
for _ in range(20):
    x = torch.tanh(x @ x)
pool = sorted(set(os.listdir("/proc/self/task")) - idle)
print(json.dumps({"torch_before": before, "torch_by_imports": by_imports, "main": nice_of(os.getpid()), "imports": import_nice,
                  "pool": [nice_of(t) for t in pool]}))
"""


def test_imports_run_at_the_lowest_priority_and_the_engine_threads_at_its_own():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # torch is imported by the low-priority thread, not at the main thread's priority
    assert (seen["torch_before"], seen["torch_by_imports"]) == (False, True)
    assert seen["imports"] == min(19, seen["main"] + 19)
    assert seen["pool"], "torch started no compute thread"
    assert all(nice == seen["main"] for nice in seen["pool"]), seen
