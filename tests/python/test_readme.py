"""The README's Python example runs as written, on a run directory `anvil train` made."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def python_example():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("\n## Python\n"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "README's Python section has one python block"
    return blocks[0]


def test_readme_example_runs(trained, tmp_path):
    code = python_example()
    assert '"runs/20261123-090353"' in code
    records = [{"instruction": "Reverse.", "input": w, "output": w[::-1]}
               for w in ("fox", "dog", "lazy", "quick", "brown", "jumps", "over", "the")]
    for name, recs in (("train.jsonl", records * 4), ("test.jsonl", records[:4])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    for path in ('"runs/20261123-090353"', '"train.jsonl"', '"test.jsonl"', '"runs/ft"'):
        assert path in code, path
    code = code.replace("runs/20261123-090353", str(trained)).replace("steps=200", "steps=20")
    code = code.replace('"runs/ft"', repr(str(tmp_path / "ft")))
    for name in ("train.jsonl", "test.jsonl"):
        code = code.replace(f'"{name}"', repr(str(tmp_path / name)))
    script = tmp_path / "example.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
