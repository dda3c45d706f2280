#!/usr/bin/env python3
"""Check lmiserve's NPU backend on an Ascend NPU; see lmiserve/npu_selfcheck.py."""

import sys

from lmiserve.npu_selfcheck import main

if __name__ == "__main__":
    sys.exit(main())
