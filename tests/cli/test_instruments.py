#!/usr/bin/env python3
"""The instruments around training: doctor, bench, the monitor fields, --batch auto under a memory limit,
cost, TensorBoard event files (read back with an independent reader), plots."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(__file__))
from common import TempDir, check, report, run, text_file  # noqa: E402

SMALL = ["--layers", "2", "--heads", "2", "--dim", "64", "--seq", "64", "--threads", "2", "--val-fraction", "0.05"]


def crc32c(data):
    """CRC-32C, bit by bit (written here independently of anvil's)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path, proto_dir):
    """TFRecords -> Event messages, checking both CRCs, with python3-protobuf and protoc's module."""
    sys.path.insert(0, proto_dir)
    import tensorboard_pb2  # noqa: E402
    events, raw = [], open(path, "rb").read()
    pos = 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        (lcrc,) = struct.unpack_from("<I", raw, pos + 8)
        if lcrc != masked(crc32c(raw[pos:pos + 8])):
            raise ValueError(f"length CRC mismatch at {pos}")
        data = raw[pos + 12:pos + 12 + n]
        (dcrc,) = struct.unpack_from("<I", raw, pos + 12 + n)
        if dcrc != masked(crc32c(data)):
            raise ValueError(f"data CRC mismatch at {pos}")
        e = tensorboard_pb2.Event()
        e.ParseFromString(data)
        events.append(e)
        pos += 12 + n + 4
    return events


def main():
    f = []
    # doctor
    r = run(["doctor"])
    check(r.returncode == 0 and "CPU:" in r.stdout, "doctor (auto) exits 0 and describes the CPU", f)
    r = run(["doctor", "--json"])
    j = json.loads(r.stdout)
    check({"model", "logical_cores", "simd", "ram_gib", "blas"} <= set(j["cpu"]), "doctor --json: CPU fields", f)
    check("cuda_built" in j["gpu"] and "usable" in j["device"], "doctor --json: GPU and device fields", f)
    if not j["gpu"].get("devices"):
        r = run(["doctor", "--device", "cuda"])
        check(r.returncode == 1 and "What to do:" in r.stdout and "not usable" in r.stdout,
              "without a usable GPU, doctor --device cuda exits 1, says why and what to do", f)

    # bench
    r = run(["bench", "--device", "cpu", "--quick", "--price-per-hour", "0.5", "--json", "-"], check=True)
    b = json.loads(r.stdout)
    names = {x["name"]: x for x in b["results"]}
    check(b["device"]["kind"] == "cpu" and {"matmul_fp32", "copy_d2d"} <= set(names), "bench --json schema", f)
    mm = names["matmul_fp32"]
    check(mm["unit"] == "TFLOP/s" and 0.001 < mm["measured"] < 100, f"sane fp32 rate ({mm['measured']:.3f} TFLOP/s)", f)
    check(0 < mm.get("ratio", 0) < 1.5, f"measured against the nominal peak ({mm.get('ratio')})", f)
    check(abs(mm["usd_per_pflop"] - 0.5 / (mm["measured"] * 3.6)) < 1e-9, "cost per PFLOP from the price", f)
    check(0.5 < names["copy_d2d"]["measured"] < 1e5, "sane copy bandwidth", f)

    with TempDir() as d:
        data = text_file(d, n_words=20000)
        # a monitored run with cost
        out = os.path.join(d, "mon")
        run(["train", "--data", data, "--out", out, "--steps", "12", "--batch", "4", "--log-every", "2",
             "--eval-every", "6", "--monitor-interval", "0.05", "--price-per-hour", "36", *SMALL], check=True)
        rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
        want = {"cpu_util", "rss_mb", "mfu", "peak_mem_mb", "data_wait_ms", "fwd_bwd_ms", "optimizer_ms",
                "tokens_per_s", "cost_usd", "usd_per_mtok", "projected_cost_usd"}
        check(all(want <= set(r) for r in rows[1:]), f"metrics.jsonl rows carry {sorted(want)}", f)
        check(all(r["projected_cost_usd"] >= r["cost_usd"] - 1e-12 for r in rows), "projection never below spend", f)
        s = json.load(open(os.path.join(out, "summary.json")))
        check({"mfu", "peak_tflops", "peak_source", "monitor", "data_wait_share", "cost_usd",
               "cost_per_million_tokens", "peak_mem_mb"} <= set(s), "summary has MFU, monitor averages, cost", f)
        check(s["monitor"]["samples"] > 0 and 0 <= s["monitor"]["cpu_util"] <= 100, "monitor averaged samples", f)
        check(abs(s["cost_per_million_tokens"] - s["cost_usd"] / (s["trained_tokens"] / 1e6)) < 1e-9,
              "cost per million tokens = cost / tokens", f)
        check(abs(s["cost_usd"] - 36 * s["wall_s"] / 3600) < 36 * 2.0 / 3600,
              f"cost = $36/h x wall time (${s['cost_usd']:.5f} for {s['wall_s']:.2f} s)", f)

        # TensorBoard: an independent reader (protoc's Python module + CRC-32C written above)
        events = [p for p in os.listdir(out) if p.startswith("events.out.tfevents.")]
        check(len(events) == 1, "one TensorBoard event file in the run directory", f)
        with tempfile.TemporaryDirectory() as pd:
            proto = os.path.join(os.path.dirname(__file__), "..", "..", "src", "io", "tensorboard.proto")
            subprocess.run(["protoc", f"--proto_path={os.path.dirname(proto)}", f"--python_out={pd}", proto],
                           check=True)
            ev = read_events(os.path.join(out, events[0]), pd)
        check(ev[0].file_version == "brain.Event:2", "first event is the file version", f)
        scal = {}
        for e in ev[1:]:
            for v in e.summary.value:
                scal.setdefault(v.tag, {})[e.step] = v.simple_value
        loss = {r["step"]: r["loss"] for r in rows}
        check(set(scal.get("train/loss", {})) == set(loss) and
              all(abs(scal["train/loss"][k] - loss[k]) <= 1e-6 * abs(loss[k]) for k in loss),
              "train/loss scalars equal metrics.jsonl at every logged step", f)
        check({"val/val_loss", "perf/tokens_per_s", "perf/mfu", "system/cpu_util", "cost/cost_usd"} <= set(scal),
              f"scalars grouped by kind ({len(scal)} tags)", f)

        # plots: a valid PNG of the requested size, and SVG
        r = run(["plot", out], check=True)
        png = open(os.path.join(out, "plot.png"), "rb").read()
        w, h = struct.unpack(">II", png[16:24])
        check(png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and (w, h) == (1200, 800),
              f"plot.png is a 1200x800 PNG ({w}x{h})", f)
        run(["plot", out, "--out", os.path.join(d, "p.svg")], check=True)
        root = ET.parse(os.path.join(d, "p.svg")).getroot()
        check(root.tag.endswith("svg"), "plot --out .svg is an SVG document", f)
        r = run(["plot", d])
        check(r.returncode == 1 and "no metrics.jsonl" in r.stderr, "plot of a non-run directory: clear error", f)

        # --batch auto under an imposed memory limit: measure what batch 4 and 8 need, allow in between
        peaks = {}
        for bs in (4, 8):
            o = os.path.join(d, f"peak{bs}")
            run(["train", "--data", data, "--out", o, "--steps", "1", "--batch", str(bs), "--tensorboard", "off",
                 *SMALL], check=True)
            peaks[bs] = json.load(open(os.path.join(o, "summary.json")))["peak_mem_mb"]
        # several runs in one plot: both named, the loss relative to the first, default FIRST/compare.png
        svg = os.path.join(d, "cmp.svg")
        run(["plot", out, os.path.join(d, "peak4"), os.path.join(d, "peak8"), "--out", svg], check=True)
        text = "".join(ET.parse(svg).getroot().itertext())
        check(all(n in text for n in (os.path.basename(out), "peak4", "peak8")) and
              f"relative to {os.path.basename(out)}" in text, "plot of three runs names each and compares", f)
        one = os.path.join(d, "one.svg")  # a one-step run: each curve is a marked point (a line needs two)
        run(["plot", os.path.join(d, "peak4"), "--out", one], check=True)
        marks = open(one).read().count("gpPt6' transform")
        check(marks >= 3, f"a one-step run's curves are drawn as points ({marks} marked)", f)
        r = run(["plot", os.path.join(d, "peak4"), out], check=True)
        check(os.path.exists(os.path.join(d, "peak4", "compare.png")), "several runs: FIRST/compare.png", f)
        limit = int((peaks[4] + peaks[8]) / 2 * (1 << 20))
        auto = os.path.join(d, "auto")
        r = run(["train", "--data", data, "--out", auto, "--steps", "4", "--batch", "auto", "--global-batch", "16",
                 "--memory-limit", str(limit), "--log-every", "1", "--tensorboard", "off", *SMALL], check=True)
        s = json.load(open(os.path.join(auto, "summary.json")))
        tried = "\n".join(s["batch_search"])
        print("   " + tried.replace("\n", "\n   "))
        check("micro-batch    8: does not fit" in tried and "micro-batch    4: fits" in tried,
              f"batch 4 fits and 8 does not under {limit >> 20} MiB", f)
        check(s["micro_batch"] <= 4 and s["micro_batch"] * s["grad_accum"] == 16,
              f"chose micro-batch {s['micro_batch']} x {s['grad_accum']} = the global batch 16", f)
        exp = os.path.join(d, "explicit")
        run(["train", "--data", data, "--out", exp, "--steps", "4", "--batch", str(s["micro_batch"]),
             "--grad-accum", str(s["grad_accum"]), "--log-every", "1", "--tensorboard", "off", *SMALL], check=True)
        la = [json.loads(l)["loss"] for l in open(os.path.join(auto, "metrics.jsonl"))]
        le = [json.loads(l)["loss"] for l in open(os.path.join(exp, "metrics.jsonl"))]
        check(la == le, "the search leaves no trace: losses equal the explicit run's", f)
        r = run(["train", "--data", data, "--out", os.path.join(d, "nofit"), "--batch", "auto", "--memory-limit",
                 "1M", *SMALL])
        check(r.returncode == 1 and "--batch auto" in r.stderr.strip().splitlines()[-1] or
              "out of memory" in r.stderr.strip().splitlines()[-1], "nothing fits: one-line error", f)

        # --profile: the per-op table, and profile.json with FLOP rates and achieved bandwidths
        prof = os.path.join(d, "prof")
        r = run(["train", "--data", data, "--out", prof, "--steps", "3", "--batch", "2", "--profile", *SMALL],
                check=True)
        check("GB/s" in r.stderr and "layernorm_fwd" in r.stderr, "--profile prints the per-op table", f)
        rows = {row["op"]: row for row in json.load(open(os.path.join(prof, "profile.json")))}
        check(rows.get("layernorm_fwd", {}).get("gb_per_s", 0) > 0 and rows["layernorm_fwd"]["calls"] == 2 * 1
              and rows.get("add+layernorm_fwd", {}).get("calls") == 2 * 4 and "residual_fwd" not in rows,
              "profile.json: layernorm_fwd with its bandwidth, 1 call a step (the first layer's first norm; every "
              "other norm is fused with the residual add before it, the second layer's first and the final one "
              "with the block's last: add+layernorm_fwd, 4 a step, no residual_fwd) over steps 2 and 3 (the "
              "first, the warm-up, left out)", f)
        check("per-op time over steps 2 to 3" in r.stderr and rows.get("download", {}).get("calls", 0) <= 2 * 3,
              "the table covers the steps after the warm-up, not the checkpoint's downloads", f)
        check(any(k.startswith("matmul_fwd") and v.get("gflops", 0) > 0 for k, v in rows.items()),
              "profile.json: matrix products with their GFLOP/s", f)
        check("gb_per_s" not in rows.get("attention_fwd", {"gb_per_s": 1}), "attention is not rated by bytes", f)
        check(abs(sum(v["share"] for v in rows.values()) - 1.0) < 1e-6, "shares add up to 1", f)

        # a Llama's q, k, v projections and its gate and up as one product each (LinearGroup): 4 products a
        # layer forward (qkv, o, gate+up, down) and no adds of input gradients; apart, 7 and 3 adds a layer
        llama = ["--arch", "llama", "--kv-heads", "1", "--ffn-dim", "96", "--log-every", "1", "--tensorboard", "off"]
        counts, losses = {}, {}
        for fuse in ("1", "0"):
            o = os.path.join(d, f"llama-fuse{fuse}")
            r = run(["train", "--data", data, "--out", o, "--steps", "3", "--batch", "2", "--profile", *llama,
                     *SMALL], check=True, env={**os.environ, "ANVIL_FUSE_PROJECTIONS": fuse})
            ops = {row["op"]: row for row in json.load(open(os.path.join(o, "profile.json")))}
            counts[fuse] = (sum(v["calls"] for k, v in ops.items() if k.startswith("matmul_fwd")),
                            ops.get("residual_fwd", {}).get("calls", 0), sorted(ops), ops["rope"]["calls"])
            losses[fuse] = [json.loads(l)["loss"] for l in open(os.path.join(o, "metrics.jsonl"))]
        check(counts["1"][:2] == (2 * (2 * 4 + 1), 0) and "matmul_fwd 128x64>128" in counts["1"][2] and
              "matmul_fwd 128x64>192" in counts["1"][2] and counts["1"][3] == 2 * 2 * 2,
              "llama: q/k/v (64>128) and gate/up (64>192) one product each, 4 a layer, no adds, q and k (dq and "
              f"dk) rotated in one call each way: {counts['1'][:2]}, {counts['1'][3]} rotations", f)
        check(counts["0"][:2] == (2 * (2 * 7 + 1), 2 * 2 * 3) and counts["0"][3] == 2 * 2 * 3,
              f"ANVIL_FUSE_PROJECTIONS=0: 7 products a layer and 3 adds, dq and dk rotated apart: {counts['0'][:2]}, "
              f"{counts['0'][3]} rotations", f)
        check(len(losses["1"]) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses["1"], losses["0"])),
              f"the same losses either way: {losses['1']} {losses['0']}", f)
    return report(f)


if __name__ == "__main__":
    sys.exit(main())
