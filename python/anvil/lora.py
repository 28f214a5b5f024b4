"""anvil.lora: LoRA adapters in the Python process."""
from typing import Any

from . import _json_command


def merge(**flags: Any) -> dict:
    """`anvil lora merge` (model=BASE, adapter=ADAPTER, out=DIR, dtype="f32"|"bf16"|"f16"): the adapter folded
    into its base as a plain model directory; what its --json prints."""
    return _json_command(["lora", "merge"], flags)
