"""anvil from Python: tokenizers, models, generation, scoring and zero-copy tensors.

    import anvil, torch
    m = anvil.Model.load("runs/demo")                      # a model, run or checkpoint directory
    print(m.generate("Once upon a time", max_new_tokens=32, temperature=0).text)
    logits = torch.from_dlpack(m.forward([[1, 2, 3]]))     # (1, 3, V), anvil's memory, no copy

The native layer (anvil._anvil) runs anvil's own C++: the same loading, prompt templates, sampling and
kernels as the `anvil` command, so a call here gives what the command gives. Long calls release the GIL.
Errors raise anvil.Error with anvil's one-line message: anvil.InputError when what was given is wrong,
anvil.DeviceError (and its anvil.OutOfMemory) when the device failed.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from . import _anvil
from ._anvil import DeviceError, Error, InputError, OutOfMemory, Tensor

__all__ = ["Tokenizer", "Model", "Completion", "Score", "Tensor", "from_dlpack", "doctor", "train", "evaluate",
           "quantize", "plan", "run_command", "data", "lora", "Error", "InputError", "DeviceError", "OutOfMemory", "__version__"]
__version__ = _anvil.version().split(" ")[0]

PathLike = Union[str, "os.PathLike[str]"]


def from_dlpack(obj: Any) -> Tensor:
    """An anvil.Tensor over the memory of `obj` (a torch tensor, a numpy array: anything with
    __dlpack__), without a copy. The producer's memory stays alive while the anvil.Tensor does."""
    return Tensor.from_dlpack(obj)


def doctor(device: str = "auto") -> dict:
    """What `anvil doctor --json` prints: whether the device can run anvil, and what the machine has."""
    return json.loads(_anvil.doctor_json(device))


def _cli_args(flags: Mapping[str, Any]) -> list:
    """Keyword arguments as the command's flags: lora_rank=8 -> --lora-rank 8; True -> the bare flag; False
    and None -> left out; a list -> the flag with each value; a trailing underscore is dropped (in_=...)."""
    args = []
    for key, value in flags.items():
        name = "--" + key.rstrip("_").replace("_", "-")  # in_="a.jsonl": --in (a keyword Python reserves)
        if value is None or value is False:
            continue
        if value is True:
            args.append(name)
        elif isinstance(value, (list, tuple)):
            args += [name, *(os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in value)]
        else:
            args += [name, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return args


def run_command(*args: str) -> int:
    """Runs an anvil command in this process, as the `anvil` binary would: run_command("data", "prepare",
    "--in", "a.jsonl", "--out", "prep"). Returns its exit status; an error raises anvil.Error with the message
    the command would print."""
    return _anvil.run_cli([os.fspath(a) for a in args])["status"]


def train(*, on_step: Optional[Callable[[dict], Optional[bool]]] = None, **flags: Any) -> dict:
    """`anvil train` with the flags as keyword arguments (data="train.jsonl", init="gpt2", lora_rank=8,
    steps=200, out="runs/ft"; see `anvil train --help`), in this process. metrics.jsonl, checkpoints and
    summary.json are written as the command writes them. Returns the run's summary (summary.json, with "out").

    on_step(record) sees each step's metrics record (step, loss, lr, grad_norm, ...); returning False stops the
    run after that step, which then saves a checkpoint as Ctrl-C does, and train returns {"interrupted": True,
    "checkpoint": DIR, "steps": N, "out": OUT}; continue it with train(resume=DIR, ...) or resume="auto".
    Ctrl-C stops the run the same way, then raises KeyboardInterrupt. A bad flag raises anvil.InputError naming
    it."""
    r = _anvil.run_cli(["train", *_cli_args(flags)], on_step)
    if not r["ended"]:
        return {"status": r["status"]}
    if r["interrupted"]:
        ckpt = r["model_dir"]
        result = {"interrupted": True, "checkpoint": ckpt, "out": r["out"], "steps": r["step"]}
        if not r["stopped_by_callback"]:
            raise KeyboardInterrupt(f"anvil.train: stopped; checkpoint in {ckpt} (continue with resume=)")
        return result
    with open(os.path.join(r["out"], "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    summary["out"] = r["out"]
    return summary


def _json_command(command: Sequence[str], flags: Mapping[str, Any]) -> dict:
    """A command with --json FILE, run in this process: the JSON it writes."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="anvil-") as d:
        out = os.path.join(d, "result.json")
        _anvil.run_cli([*command, *_cli_args(flags), "--json", out])
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def evaluate(**flags: Any) -> dict:
    """`anvil eval` with the flags as keyword arguments (model="runs/ft", data="test.jsonl", per_example=FILE,
    choices=FILE, ...), in this process: what `anvil eval --json` prints (loss, perplexity, exact_match, ...)."""
    return _json_command(["eval"], flags)


def quantize(**flags: Any) -> dict:
    """`anvil quantize` (model=DIR, out=DIR, adapter=DIR, ...): an int8 copy of a model; what its --json
    prints (tensors, max_rel_error, bytes_before, bytes_after, ...)."""
    return _json_command(["quantize"], flags)


def plan(**flags: Any) -> dict:
    """`anvil plan` (tokens="10B", model=DIR or arch/layers/heads/dim/seq, gpus="h100:8,l40s", price=["h100=2.1"],
    lora_rank=..., ...): which card, how many, how long and what it costs; what `anvil plan --json` prints (rows
    with each card's layout, memory, speed, hours and dollars; fastest, cheapest)."""
    return _json_command(["plan"], flags)


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def _ids(b: bytes) -> np.ndarray:
    """int32 ids from the native layer's bytes (arrays cross as bytes: the module needs no numpy C API)."""
    return np.frombuffer(b, dtype=np.int32).copy()


class Tokenizer:
    """A tokenizer: GPT-2 BPE files, a Hugging Face tokenizer.json, "byte", or the one a model directory
    was trained with (Tokenizer.load)."""

    def __init__(self, native: "_anvil.Tokenizer"):
        self._t = native

    @classmethod
    def load(cls, path: PathLike) -> "Tokenizer":
        """From "byte", a directory or file of tokenizer files (tokenizer.json, vocab.json + merges.txt,
        encoder.json + vocab.bpe), a model or run directory (the tokenizer it was trained with), or a GGUF file."""
        return cls(_anvil.Tokenizer.load(os.fspath(path)))

    def encode(self, text: str, *, special_tokens: bool = True) -> np.ndarray:
        """Token ids (int32) as `anvil tokenize` prints them: special-token text (<|endoftext|>, <|eot_id|>,
        </s>) becomes its id unless special_tokens=False. No BOS is added."""
        return _ids(self._t.encode(text, special_tokens))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` (invalid UTF-8 becomes U+FFFD)."""
        return _text(self._t.decode(np.asarray(ids, dtype=np.int32).reshape(-1).tobytes()))

    def render(self, record: Mapping[str, Any], *, template: str = "auto", prompt_only: bool = False) -> str:
        """An instruction record {"instruction", "input", "output"} or a chat {"messages": [...]} as training
        renders it in `template` (auto: the one the tokenizer's special tokens say); prompt_only: what the
        model is given to answer it."""
        return self._t.render(json.dumps(record), template, prompt_only)[0]

    @property
    def eos_id(self) -> int:
        """The id that ends every document and record (GPT-2's <|endoftext|>, Llama's EOS)."""
        return self._t.eos_id

    @property
    def bos_id(self) -> Optional[int]:
        """The id put before every document where the tokenizer asks for one (Llama), else None."""
        b = self._t.bos_id
        return None if b < 0 else b

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    def __repr__(self) -> str:
        return f"anvil.Tokenizer({self._t.kind}, vocab_size={self.vocab_size})"


@dataclass
class Completion:
    """One generated answer: its text, its token ids (the stop token included), why it ended ("stop": an
    end-of-text or end-of-turn token or a stop string; "length": max_new_tokens) and, when asked for, each
    token's log-probability under the model's raw logits."""
    text: str
    tokens: np.ndarray
    finish_reason: str
    logprobs: Optional[list] = None
    prompt_tokens: int = 0


@dataclass
class Score:
    """A text's tokens after the end-of-text token that opens it, and each one's log-probability (natural
    log) given those before it."""
    tokens: np.ndarray
    logprobs: np.ndarray

    @property
    def logprob(self) -> float:
        return float(np.sum(self.logprobs, dtype=np.float64))

    @property
    def perplexity(self) -> float:
        return float(np.exp(-self.logprob / max(len(self.logprobs), 1)))


_SAMPLING = dict(max_new_tokens=128, temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0,
                 frequency_penalty=0.0, repetition_penalty=1.0, seed=1337, stop=None, ignore_eos=False,
                 logprobs=False)


def _sampling(kw: dict) -> dict:
    unknown = set(kw) - set(_SAMPLING)
    if unknown:
        raise InputError(f"unknown sampling argument{'s' if len(unknown) > 1 else ''}: "
                         f"{', '.join(sorted(unknown))}; known: {', '.join(_SAMPLING)}")
    args = dict(_SAMPLING, **kw)
    stop = args["stop"]
    args["stop"] = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    return args


class Model:
    """A model loaded to run: generate, stream, chat, score, forward, state_dict.

    Model.load takes what `anvil generate --model` takes: a model directory (config.json + safetensors,
    Hugging Face's or anvil's), a run directory (its final model), a checkpoint or a GGUF file, with an optional PEFT
    LoRA adapter. Weights are held in f32 on the device unless precision= says otherwise."""

    def __init__(self, native: "_anvil.Model"):
        self._m = native
        self._tok = Tokenizer(native.tokenizer)

    @classmethod
    def load(cls, path: PathLike, adapter: Optional[PathLike] = None, *, device: str = "auto",
             precision: Optional[str] = None, threads: int = 0, tokenizer: Optional[PathLike] = None,
             template: Optional[str] = None) -> "Model":
        """device: "cpu", "cuda" or "auto" (CUDA when a usable GPU is visible); precision: "fp32" (None),
        "bf16" or "fp16", the model's tensors on CUDA (on the CPU, "bf16" keeps f32 tensors and multiplies the
        linear layers in bf16, as PyTorch's CPU autocast; "fp16" is refused); threads: CPU threads (0: all
        cores); tokenizer, template: override the model's (as --tokenizer and --template)."""
        return cls(_anvil.Model.load(os.fspath(path), os.fspath(adapter) if adapter else "", device,
                                     precision or "fp32", threads, os.fspath(tokenizer) if tokenizer else "",
                                     template or ""))

    @property
    def config(self) -> dict:
        """The model's config.json (Hugging Face's keys, with anvil's own)."""
        return json.loads(self._m.config_json)

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tok

    @property
    def device(self) -> str:
        return self._m.device

    @property
    def template(self) -> str:
        """The prompt template instructions and chats are rendered in."""
        return self._m.template

    def _prompt(self, prompt: Optional[str], instruction: Optional[str], input: str) -> list:
        if (prompt is None) == (instruction is None):
            raise InputError("give a prompt or an instruction (with input), not both")
        if instruction is not None:
            return self._m.instruction_ids(instruction, input)
        return self._m.prompt_ids(prompt)

    def _run(self, ids: list, kw: dict, on_text=None) -> Completion:
        text, tokens, finish, logprobs = self._m.generate(ids, _sampling(kw), on_text)
        return Completion(_text(text), _ids(tokens), finish, logprobs, len(ids))

    def generate(self, prompt: Optional[str] = None, *, instruction: Optional[str] = None, input: str = "",
                 **sampling) -> Completion:
        """A completion of `prompt` (plain text, with BOS where the tokenizer adds one), or the answer to an
        instruction record in the model's template, as `anvil generate` gives it. Sampling: max_new_tokens
        (128), temperature (0.8; 0 = greedy), top_k (0 = off), top_p (1 = off), min_p, presence_penalty,
        frequency_penalty, repetition_penalty, seed (1337), stop (strings that end the text, not included),
        ignore_eos (keep going past end-of-text and end-of-turn), logprobs (each token's log-probability)."""
        return self._run(self._prompt(prompt, instruction, input), sampling)

    def chat(self, messages: Sequence[Mapping[str, str]], **sampling) -> Completion:
        """The assistant's reply to a conversation [{"role": "system"|"user"|"assistant", "content": ...}]
        ending with a user message, in the model's chat template."""
        pairs = [(m["role"], m["content"]) for m in messages]
        return self._run(self._m.chat_ids(pairs), sampling)

    def stream(self, prompt: Optional[str] = None, *, instruction: Optional[str] = None, input: str = "",
               messages: Optional[Sequence[Mapping[str, str]]] = None, **sampling) -> Iterator[str]:
        """generate (or chat, with messages=) as an iterator of text pieces, each whole characters, yielded
        as the model makes them. Leaving the loop early stops the generation."""
        if messages is not None:
            ids = self._m.chat_ids([(m["role"], m["content"]) for m in messages])
        else:
            ids = self._prompt(prompt, instruction, input)
        args = _sampling(sampling)
        pieces: "queue.Queue[Any]" = queue.Queue()
        done, stop = object(), threading.Event()

        def on_text(piece: bytes) -> bool:
            pieces.put(_text(piece))
            return not stop.is_set()

        def run() -> None:
            try:
                self._m.generate(ids, args, on_text)
            except BaseException as e:  # handed to the reader
                pieces.put(e)
            finally:
                pieces.put(done)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            worker.join()

    def score(self, texts: Union[str, Sequence[str]]) -> Union[Score, list]:
        """Each text's per-token log-probabilities after the end-of-text token that opens it (the last n_ctx
        tokens of a longer one). A string gives one Score, a list a list."""
        def one(text: str) -> Score:
            ids, logprobs = self._m.score(text)
            return Score(_ids(ids), np.frombuffer(logprobs, dtype=np.float32).copy())
        return one(texts) if isinstance(texts, str) else [one(t) for t in texts]

    def forward(self, ids: Any) -> Tensor:
        """The logits (B, T, V) f32 of token ids (T,) or (B, T) (a list, numpy array or CPU torch tensor), in
        a tensor of their own: torch.from_dlpack and numpy.asarray share its memory."""
        a = np.asarray(ids)
        if a.ndim not in (1, 2):
            raise InputError(f"forward: ids are (T,) or (B, T), got {a.ndim} dimensions")
        b, t = (1, a.shape[0]) if a.ndim == 1 else a.shape
        if np.any(a != a.astype(np.int32)):
            raise InputError("forward: ids must be integers that fit int32")
        return self._m.forward(a.astype(np.int32).tobytes(), int(b), int(t))

    def state_dict(self) -> dict:
        """Every parameter under its Hugging Face name, as anvil.Tensors over the model's own memory (as
        torch's state_dict: writing to one changes the model)."""
        return dict(self._m.state_dict())

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> tuple:
        """Copies tensors (torch, numpy or anvil; f32, bf16 or f16) into the parameters of their names.
        strict: every parameter must be given and every name must be one. Returns (missing, unexpected)."""
        names = [n for n, _ in self._m.state_dict()]
        missing = [n for n in names if n not in state]
        unexpected = [n for n in state if n not in set(names)]
        if strict and (missing or unexpected):
            raise InputError("load_state_dict: " + "; ".join(
                s for s in (f"missing {', '.join(missing[:5])}" if missing else "",
                            f"unexpected {', '.join(unexpected[:5])}" if unexpected else "") if s))
        for name, value in state.items():
            if name in unexpected:
                continue
            self._m.load_param(name, _as_tensor(value))
        return missing, unexpected

    def __repr__(self) -> str:
        c = self.config
        return (f"anvil.Model({c.get('model_type')}, {self._m.base_dir}, device={self.device}, "
                f"template={self.template})")


def _as_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "detach"):  # torch: no autograd history across the exchange
        value = value.detach()
        if str(value.dtype) == "torch.float64":
            value = value.float()
        return Tensor.from_dlpack(value.contiguous())
    a = np.asarray(value)
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    return Tensor.from_dlpack(np.ascontiguousarray(a))


from . import data, lora  # noqa: E402  (they use the helpers above)
