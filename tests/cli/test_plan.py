"""anvil plan against what training measures. On the CPU: the predicted peak allocation of GPT-2 and Llama runs
(recompute off, selective and full; LoRA on a base; ZeRO-1 over 2 processes under mpirun) within 10% of each
run's own reported peak. On the cards, from the committed records (bench/results): GPT-2 124M's memory and
speed on the H100 at 16 x 1024 in bf16, and the H200's; every measured rate names its record, whose figure it
quotes. The data-parallel step times equal bench/step_time_model.py's step() given the same inputs. Bad input
(unknown card kinds, a token budget of 0, a shape that fits nowhere, a bad price) gets a one-line error.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import ANVIL, check, report, run, text_file  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(REPO, "bench", "results")
sys.path.insert(0, os.path.join(REPO, "bench"))
import step_time_model as stm  # noqa: E402

SHAPE = ["--layers", "2", "--dim", "64", "--heads", "4", "--seq", "64", "--vocab", "320"]
GPT2_124M = ["--layers", "12", "--heads", "12", "--dim", "768", "--seq", "1024", "--vocab", "50304"]
MPI_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def plan(*args):
    return json.loads(run(["plan", "--tokens", "1B", *args, "--json"], check=True).stdout)


# The FP8 records came before the CUDA backend kept each FP8 product's roundings for its backward (fca962e,
# d9f1f06): one byte for every element of a block linear layer's input and weight, a 1 KiB header and the weight's
# part rounded up to 256 bytes (src/backend/device_sizes.h). The card's peak grows by exactly that: the
# buffers are planned activations. For GPT-2 blocks of width C over N rows: inputs C, C, C and 4C a row, weights
# 3C^2, C^2, 4C^2 and 4C^2.
def fp8_kept_gib(layers, C, N):
    def one(cin, cout):
        return 1024 + (cin * cout + 255) // 256 * 256 + N * cin
    return layers * (one(C, 3 * C) + one(C, C) + one(C, 4 * C) + one(4 * C, C)) / 2**30


def trained_peak(tmp, name, args, ranks=1):
    out = os.path.join(tmp, name)
    cmd = ["train", "--data", os.path.join(tmp, "data.txt"), "--steps", "2", "--out", out, "--eval-every", "0",
           *args]
    if ranks == 1:
        run(cmd, timeout=300, check=True)
    else:
        r = subprocess.run([shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
                            ANVIL, *cmd], capture_output=True, text=True, timeout=300, env={**os.environ, **MPI_ENV})
        if r.returncode != 0:
            raise AssertionError(f"mpirun anvil {' '.join(cmd)}:\n{r.stderr[-2000:]}")
    return json.load(open(os.path.join(out, "summary.json")))["peak_mem_mb"] * 2**20, out


def check_cpu(tmp, failures):
    text_file(tmp, "data.txt", n_words=20000)
    batch = ["--batch", "4", "--threads", "2"]
    cases = [("gpt2, recompute off", ["--arch", "gpt2", "--recompute", "off"]),
             ("gpt2, recompute selective", ["--arch", "gpt2", "--recompute", "selective"]),
             ("llama, GQA, recompute full", ["--arch", "llama", "--kv-heads", "2", "--recompute", "full"])]
    base = None
    for k, (label, flags) in enumerate(cases):
        got, out = trained_peak(tmp, f"run{k}", [*SHAPE, *flags, *batch, "--grad-accum", "2"])
        base = base or os.path.join(out, "final")
        want = plan(*SHAPE, *flags, *batch, "--global-batch", "8", "--gpus", "cpu", "--precision", "fp32")
        pred = want["rows"][0]["memory"]["total"]
        check(abs(pred / got - 1) < 0.10, f"CPU {label}: predicted {pred / 2**20:.3f} MiB, the run's peak "
              f"{got / 2**20:.3f} MiB ({100 * (pred / got - 1):+.1f}%)", failures)
    lora = ["--lora-rank", "8"]  # the family's default targets (c_attn)
    got, _ = trained_peak(tmp, "lora", ["--init", base, *lora, "--seq", "64", *batch])
    pred = plan("--model", base, *lora, "--seq", "64", *batch, "--global-batch", "4", "--gpus", "cpu",
                "--precision", "fp32")["rows"][0]["memory"]["total"]
    check(abs(pred / got - 1) < 0.10, f"CPU LoRA rank 8 on a base: predicted {pred / 2**20:.3f} MiB, the run's "
          f"peak {got / 2**20:.3f} MiB ({100 * (pred / got - 1):+.1f}%)", failures)
    if shutil.which("mpirun") and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(ANVIL)),
                                                              "libanvil_mpi.so")):
        one = ["--batch", "4", "--threads", "1"]
        got, _ = trained_peak(tmp, "zero", [*SHAPE, "--arch", "gpt2", "--zero", "1", *one], ranks=2)
        pred = plan(*SHAPE, "--zero", "1", *one, "--global-batch", "8", "--gpus", "cpu:2", "--precision", "fp32")
        row = pred["rows"][0]
        check(row["layout"]["zero"] == 1 and abs(row["memory"]["total"] / got - 1) < 0.10,
              f"CPU ZeRO-1 over 2 processes (mpirun): predicted {row['memory']['total'] / 2**20:.3f} MiB a rank, "
              f"the run's peak {got / 2**20:.3f} MiB ({100 * (row['memory']['total'] / got - 1):+.1f}%)", failures)
    else:
        print("note: mpirun or the MPI plugin missing; ZeRO-1 over 2 processes not checked")


def record(name):
    return json.load(open(os.path.join(RESULTS, name)))


def check_cards(failures):
    h100 = record("2026-11-27-h100.json")["anvil"]
    row = plan(*GPT2_124M, "--gpus", "h100:1", "--batch", "16", "--global-batch", "16")["rows"][0]
    mem = row["memory"]["total"] / 2**30
    check(abs(mem / h100["peak_mem_gib"] - 1) < 0.10, f"H100, GPT-2 124M 16x1024 bf16: predicted {mem:.3f} GiB, "
          f"the card measured {h100['peak_mem_gib']:.3f} GiB", failures)
    tps = row["speed"]["tokens_per_s"]
    check(abs(tps / h100["tokens_per_s"] - 1) < 0.10 and row["speed"]["measured"],
          f"H100: predicted {tps:.0f} tokens/s, the record {h100['tokens_per_s']} ({row['speed']['source']})",
          failures)
    h200 = record("2026-11-27-h200-b16.json")["anvil"]
    row = plan(*GPT2_124M, "--gpus", "h200:1", "--batch", "16", "--global-batch", "16")["rows"][0]
    check(abs(row["speed"]["tokens_per_s"] / h200["tokens_per_s"] - 1) < 0.10
          and abs(row["memory"]["total"] / 2**30 / h200["peak_mem_gib"] - 1) < 0.10,
          f"H200, GPT-2 124M 16x1024: {row['speed']['tokens_per_s']:.0f} tokens/s (record {h200['tokens_per_s']}), "
          f"{row['memory']['total'] / 2**30:.3f} GiB (record {h200['peak_mem_gib']:.3f})", failures)
    # another shape than the rates came from: GPT-2 24 x 1024 at 8 x 1024 (bench/gpu_fp8_bench.py's second run),
    # bf16 and fp8, on both cards
    for card, name in [("h100", "2026-11-27-h100-fp8-6f80acc.json"), ("h200", "2026-11-27-h200-fp8.json")]:
        run24 = next(r for r in record(name)["runs"] if r["config"] == "gpt2-24L-1024")
        for precision in ("bf16", "fp8"):
            rec = run24.get(precision) or {}
            if not rec.get("tokens_per_s"):
                continue  # the H100 run refused FP8
            row = plan("--layers", "24", "--heads", "16", "--dim", "1024", "--seq", "1024", "--vocab", "50304",
                       "--gpus", f"{card}:1", "--batch", "8", "--global-batch", "8", "--precision", precision)["rows"][0]
            mem, tps = row["memory"]["total"] / 2**30, row["speed"]["tokens_per_s"]
            kept = fp8_kept_gib(24, 1024, 8 * 1024) if precision == "fp8" else 0.0
            since = f" + {kept:.3f} kept since" if kept else ""
            check(abs(mem / (rec["peak_mem_gib"] + kept) - 1) < 0.10 and abs(tps / rec["tokens_per_s"] - 1) < 0.10,
                  f"{card}, GPT-2 24x1024 8x1024 {precision}: {mem:.3f} GiB (measured {rec['peak_mem_gib']:.3f}{since}), "
                  f"{tps:.0f} tokens/s (measured {rec['tokens_per_s']:.0f}, {100 * (tps / rec['tokens_per_s'] - 1):+.1f}%)",
                  failures)
    # every rate says where it came from; a measured one quotes its record's figure
    every = plan(*GPT2_124M)
    quoted = True
    for r in every["rows"]:
        src = r["speed"]["source"]
        if r["speed"]["measured"]:
            name = src.split("bench/results/")[1].split(" ")[0]
            j = record(name)
            tps = j["anvil"]["tokens_per_s"] if "anvil" in j else j["runs"][0]["fp8"]["tokens_per_s"]
            quoted = quoted and f"{tps:.0f} tokens/s" in src
        else:
            quoted = quoted and src.startswith("assumed: ") and "2026-11-27-h100.json" in src
    kinds = sorted({r["kind"] for r in every["rows"]})
    check(quoted and len(kinds) == 7, f"the default table ({', '.join(kinds)}): measured rates quote their record, "
          "the rest say they are assumed and from what", failures)
    check(every["fastest"] >= 0 and every["cheapest"] >= 0, "a fastest and a cheapest plan", failures)


def check_step_model(failures):
    """The C++ step time equals bench/step_time_model.py's step() on the same inputs (GPT-2 1.5B, 8 H100s)."""
    worst = 0.0
    for zero in ("0", "1"):
        row = plan("--layers", "48", "--heads", "25", "--dim", "1600", "--seq", "1024", "--gpus", "h100:8",
                   "--zero", zero, "--batch", "16", "--global-batch", "1024")["rows"][0]
        s, sp = row["step_model"], row["speed"]
        stm.shape = lambda m, s=s: {k: s[k] for k in ("params", "layer_params", "rest_params", "flops_per_token",
                                                     "bwd_head", "bwd_layer")}
        m = dict(layers=48, seq=1024, batch_tokens=s["global_tokens"], micro=s["micro_tokens"] // 1024)
        fab = dict(gpus=8, busbw=s["busbw"], alpha=s["alpha"])
        py = stm.step(m, fab, s["rate_flops"], zero=zero == "1", hbm=s["hbm_bytes_s"])
        for k in ("compute_s", "reduce_s", "exposed_reduce_s", "optimizer_s", "allgather_s", "step_s"):
            worst = max(worst, abs(sp[k] - py[k]) / max(py[k], 1e-30))
    check(worst < 1e-9, f"the step times equal bench/step_time_model.py's (ZeRO-1 off and on; largest relative "
          f"difference {worst:.1e})", failures)


def one_line_error(args, needle, what, failures):
    r = run(["plan", *args])
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and needle in r.stderr, f"{what}: {r.stderr.strip()[:200]}",
          failures)


def check_errors(failures):
    one_line_error(["--tokens", "1B", "--gpus", "b200:8"], "unknown card kind b200", "an unknown card kind", failures)
    one_line_error(["--tokens", "0"], "--tokens 0", "a token budget of 0", failures)
    one_line_error(["--tokens", "1B", "--layers", "200", "--heads", "128", "--dim", "32768", "--seq", "4096"],
                   "fits on none of the cards", "a 2.6T-parameter model", failures)
    one_line_error(["--tokens", "1B", "--price", "h100=cheap"], "--price h100=cheap", "a price that is no number",
                   failures)
    one_line_error(["--tokens", "1B", "--model", "nowhere", "--layers", "4"], "--layers", "--model with a shape flag",
                   failures)


def check_readme(failures):
    """The README's worked example is what the command prints."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    cmd = "anvil plan --layers 48 --heads 25 --dim 1600 --seq 1024 --tokens 10B"
    block = readme[readme.index(cmd):].split("```")[2].strip("\n")
    got = run(cmd.split()[1:], check=True).stdout.strip("\n")
    check(block == got, "the README's worked example (1.5B on 10B tokens) is what anvil plan prints", failures)


def main():
    failures = []
    tmp = tempfile.mkdtemp(prefix="anvil_plan_")
    try:
        check_cpu(tmp, failures)
        check_cards(failures)
        check_step_model(failures)
        check_errors(failures)
        check_readme(failures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
