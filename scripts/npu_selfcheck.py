#!/usr/bin/env python3
"""Check lmiserve's NPU backend on an Ascend NPU; see lmiserve/rolling_batch/npu_selfcheck.py."""

import sys

from lmiserve.rolling_batch.npu_selfcheck import main

if __name__ == "__main__":
    sys.exit(main())
