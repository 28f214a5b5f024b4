"""A --verify checker for the pseudo-label test: accepts a record whose output reverses its input."""
import json
import sys

rec = json.loads(sys.stdin.readline())
sys.exit(0 if rec["output"] == rec["input"][::-1] else 1)
