"""anvil.data: `anvil data` commands in the Python process."""
import json
import os
from typing import Any

from . import _anvil, _cli_args


def prepare(**flags: Any) -> dict:
    """`anvil data prepare` with the flags as keyword arguments (in_="train.jsonl" for --in, out="prep",
    tokenizer=..., val_fraction=..., near_dedup=True, ...): tokenized shards and their index in `out`. Returns
    the report the command writes (out/report.json: records kept and rejected, by reason)."""
    _anvil.run_cli(["data", "prepare", *_cli_args(flags)])
    with open(os.path.join(os.fspath(flags["out"]), "report.json"), encoding="utf-8") as f:
        return json.load(f)
