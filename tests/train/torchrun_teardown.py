"""Run by test_fsdp_teardown under torchrun: ``vlrl.train.loop.train`` on the overrides given, then print
this process's thread names (one JSON line per rank)."""

import json
import os
import sys

from vlrl.train.config import load_config
from vlrl.train.loop import train

summary = train(load_config("color_square", sys.argv[1:]))
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print(json.dumps({"rank": int(os.environ["RANK"]), "threads": threads, "steps": summary["steps"]}), flush=True)
