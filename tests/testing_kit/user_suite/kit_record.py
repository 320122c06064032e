"""Records a started runtime's processes for the outer test (copied next to the user files)."""

import json
import os
from pathlib import Path

import psutil


def record_runtime(runtime):
    """Every process of `runtime` (up and below it, and whatever names its data dir:
    Postgres, Redis), with its command line, written atomically to $KIT_RECORD."""
    procs = {pid: "" for pid in runtime.processes()}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] in procs or str(runtime.data_dir) in cmdline:
            procs[proc.info["pid"]] = cmdline
    staged = Path(os.environ["KIT_RECORD"] + ".tmp")
    staged.write_text(json.dumps({"url": runtime.url, "processes": procs}))
    staged.replace(os.environ["KIT_RECORD"])  # the outer test never reads half a file
