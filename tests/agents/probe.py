"""Sends raw lines to durun and logs the answers.

usage: probe.py SCRIPT.json ANSWERS.jsonl
SCRIPT is a list of {"send": LINE, "answer": true|false}; the answers are
appended to ANSWERS, one JSON line each.
"""
import json
import sys

script = json.load(open(sys.argv[1]))
with open(sys.argv[2], "a") as log:
    for item in script:
        sys.stdout.write(item["send"] + "\n")
        sys.stdout.flush()
        if item.get("answer", True):
            log.write(sys.stdin.readline())
            log.flush()
