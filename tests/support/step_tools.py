"""A tool pack for sequential pipelines: steps that shout, combine, fail and nap (unit and integration)."""

from __future__ import annotations

STEP_TOOLS = '''
import time

def shout(text, times=1):
    return {"text": (text.upper() + "!") * times}

def combine(count, reversed):
    return {"summary": "%d words, reversed: %s" % (count["count"], reversed["text"])}

def fail(**kwargs):
    raise ValueError("tool-authored failure text")

def nap(seconds, log):
    with open(log, "a") as fh:
        fh.write("call\\n")
    time.sleep(seconds)
    return {"slept": seconds}
'''

STEP_TOOLS_MANIFEST = {
    "package_id": "step-tools",
    "version": "1.0.0",
    "package_type": "toolpack",
    "entrypoint": "step_tools",
    "capabilities": {"tools": [
        {"name": "shout", "entrypoint": "step_tools:shout"},
        {"name": "combine", "entrypoint": "step_tools:combine"},
        {"name": "fail", "entrypoint": "step_tools:fail"},
        {"name": "nap", "entrypoint": "step_tools:nap"},
    ]},
}  # fmt: skip
