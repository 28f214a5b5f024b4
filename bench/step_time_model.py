#!/usr/bin/env python3
"""Step time = compute + exposed communication, for data-parallel GPT-2 training on many GPUs.

The model follows what `anvil train` does under `mpirun`/`srun` on GPUs (docs/distributed.md):
  * every rank runs ranks_tokens = global_batch / ranks tokens per step, in micro-batches of --micro sequences
    (gradient accumulation); gradients are reduced only in the last micro-batch's backward;
  * the backward finishes the head first, then layers L-1 .. 0, then the embeddings; each layer's bf16 gradients
    are one bucket whose collective starts as soon as that layer's backward ends, on one communication stream
    (buckets run one after another, in a fixed order). The embeddings, final norm and head are the last bucket:
    GPT-2's tied token embedding gets its last gradient from the embedding backward at the very end;
  * an all-reduce of S bytes over N ranks takes alpha + S * 2(N-1)/N / busbw (busbw as nccl-tests reports it);
    ZeRO-1 (`--zero 1`) reduces each piece to its owner (ncclReduce: alpha + S / busbw), updates 1/N of AdamW,
    then all-gathers the bf16 weights (grouped ncclBroadcast: S / busbw), which nothing hides;
  * AdamW is memory-bound: 28 bytes per parameter (f32 master, m, v read and written; bf16 gradient and weight).

Compute comes from a measured rate. By default: llm.c's published GPT-2 1558M run on 8xH100 SXM (2.80 s per
step of 1,048,576 tokens, karpathy/llm.c scripts/run_gpt2_1558M.sh), turned into FLOP/s per GPU by inverting
this same model; with --compute-json, anvil's own rate from bench/gpu_train_bench.py's gpu_train_bench.json.
FLOPs per token are counted as llm.c and bench/gpu_train_bench.py count them: 6 N + 6 L d T.

  python3 bench/step_time_model.py [--compute-json gpu_train_bench.json] [--json FILE]
  python3 bench/step_time_model.py --check     (the model's own tests; run by ctest)
"""
import argparse
import json
import math
import sys

H100_BF16_DENSE = 989.4e12  # FLOP/s, NVIDIA's H100 SXM figure
A100_BF16_DENSE = 312e12

MODELS = {  # GPT-2 shapes with the vocabulary padded to 50304 (llm.c, anvil); global batches as llm.c trains them
    "124M": dict(layers=12, dim=768, vocab=50304, seq=1024, batch_tokens=524288, micro=64),
    "1.5B": dict(layers=48, dim=1600, vocab=50304, seq=1024, batch_tokens=1048576, micro=16),
}

# Published nccl-tests all-reduce bus bandwidths at large messages, and an assumed per-collective latency.
FABRICS = {
    "8xH100 SXM, NVLink": dict(gpus=8, busbw=460e9, alpha=20e-6,
                               source="docs.alayanew.com nccl-tests post: 8xH100 SXM5 NVLink 460-480 GB/s"),
    "2 nodes, 16xH100, IB NDR": dict(gpus=16, busbw=400e9, alpha=40e-6,
                                     source="saturncloud.io NCCL validation: H100 SXM NVLink + IB NDR 400-450 GB/s"),
    "16 nodes, 128xH100, IB NDR": dict(gpus=128, busbw=400e9, alpha=80e-6,
                                       source="as 2 nodes (rail-optimised fat tree; latency grows with the ring)"),
}
A100_NODE = dict(gpus=8, busbw=240e9, alpha=20e-6, source="docs.alayanew.com: 8xA100 SXM4 NVLink 230-250 GB/s")

LLMC = [  # llm.c's published step times (scripts/run_gpt2_*.sh, karpathy/llm.c)
    dict(name="llm.c GPT-2 124M, 8xA100 80GB SXM", model="124M", fabric=A100_NODE, peak=A100_BF16_DENSE,
         hbm=1.8e12, step_s=0.300, source="scripts/run_gpt2_124M.sh: 524,288 tokens/step in ~300 ms"),
    dict(name="llm.c GPT-2 1558M, 8xH100 80GB SXM", model="1.5B", fabric=FABRICS["8xH100 SXM, NVLink"],
         peak=H100_BF16_DENSE, hbm=3.0e12, step_s=2.80, source="scripts/run_gpt2_1558M.sh: 1,048,576 tokens/step in 2.80 s"),
]

GRAD_BYTES = 2  # bf16 gradients
ADAMW_BYTES = 28
HBM_BYTES_S = 3.0e12  # assumed streaming rate of H100 SXM HBM3 (3.35 TB/s peak; A100 80GB: 1.8 of 2.0 TB/s);
# with --compute-json, the card's measured copy bandwidth


def shape(m):
    L, d, V, T = m["layers"], m["dim"], m["vocab"], m["seq"]
    layer = 12 * d * d + 13 * d  # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj with biases
    rest = V * d + T * d + 2 * d  # wte (tied head), wpe, ln_f
    params = L * layer + rest
    flops = 6 * params + 6 * L * d * T
    # the backward's FLOPs per token: twice the forward's, split by where they are spent
    bwd_head = 4 * V * d
    bwd_layer = 4 * layer + 4 * d * T
    return dict(params=params, layer_params=layer, rest_params=rest, flops_per_token=flops,
                bwd_head=bwd_head, bwd_layer=bwd_layer, bwd_total=bwd_head + L * bwd_layer)


def step(m, fab, rate, zero=False, hbm=HBM_BYTES_S):
    """One step's times (seconds) for model m on fabric fab at `rate` FLOP/s per GPU."""
    s = shape(m)
    N = fab["gpus"]
    tokens = m["batch_tokens"] / N
    micro = min(m["micro"] * m["seq"], tokens)
    if tokens < m["seq"]:
        raise ValueError(f"{m['batch_tokens']} tokens over {N} GPUs leaves less than one sequence per GPU")
    compute = tokens * s["flops_per_token"] / rate
    # the last micro-batch's backward, layer by layer, with each bucket's collective queued on one stream
    t_tok = micro / rate
    t = s["bwd_head"] * t_tok
    buckets = []  # (ready time, bytes)
    for _ in range(m["layers"]):
        t += s["bwd_layer"] * t_tok
        buckets.append((t, s["layer_params"] * GRAD_BYTES))
    buckets.append((t, s["rest_params"] * GRAD_BYTES))  # the embeddings' backward is a scatter: ~no FLOPs
    bwd_end = t
    comm_total, free = 0.0, 0.0
    for ready, S in buckets:
        if N == 1:
            c = 0.0
        elif zero:
            c = fab["alpha"] + S / fab["busbw"]
        else:
            c = fab["alpha"] + S * 2 * (N - 1) / N / fab["busbw"]
        free = max(free, ready) + c
        comm_total += c
    exposed = max(0.0, free - bwd_end)
    opt = s["params"] * ADAMW_BYTES / hbm / (N if zero else 1)
    gather = 0.0
    if zero and N > 1:
        gather = fab["alpha"] + s["params"] * GRAD_BYTES / fab["busbw"]
    total = compute + exposed + opt + gather
    return dict(compute_s=compute, reduce_s=comm_total, exposed_reduce_s=exposed, optimizer_s=opt,
                allgather_s=gather, step_s=total, tokens_per_gpu=tokens, accumulation=int(tokens // micro),
                comm_share=(exposed + gather) / total, tokens_per_s=m["batch_tokens"] / total)


def invert(case):
    """The FLOP/s per GPU at which the model gives a published step time (bisection on the rate)."""
    m = MODELS[case["model"]]
    lo, hi = 1e12, 5e15
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if step(m, case["fabric"], mid, hbm=case["hbm"])["step_s"] > case["step_s"]:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def compute_from_json(path):
    r = json.load(open(path))
    a, c = r["anvil"], r["config"]
    m = dict(layers=c["layers"], dim=c["dim"], vocab=c["vocab"], seq=c["seq"])
    flops = shape(dict(m, batch_tokens=0, micro=1))["flops_per_token"]
    rate = a["tokens_per_s"] * flops
    copy = next((x["measured"] for x in r.get("bench", []) if x.get("name") == "copy_d2d"), 0.0)  # GB/s
    hbm = copy * 1e9 if copy else HBM_BYTES_S
    name = (r.get("device") or {}).get("name", "GPU")
    return rate, hbm, f"anvil on {name}, commit {r.get('commit', '?')[:10]}: {a['tokens_per_s']} tokens/s at " \
                      f"{c['layers']}L/{c['dim']}, batch {c['batch']}x{c['seq']}"


def table(rate, hbm):
    rows = []
    for mname, m in MODELS.items():
        for fname, fab in FABRICS.items():
            one = step(m, dict(fab, gpus=1), rate, hbm=hbm)
            for zero in (False, True):
                r = step(m, fab, rate, zero=zero, hbm=hbm)
                r.update(model=mname, fabric=fname, zero=zero,
                         efficiency=r["tokens_per_s"] / (fab["gpus"] * one["tokens_per_s"]))
                rows.append(r)
    return rows


def markdown(rows):
    out = ["| model | GPUs | ZeRO-1 | tokens/GPU (accum) | compute ms | reduce ms (exposed) | all-gather ms | "
           "AdamW ms | step ms | tokens/s | comm share | efficiency |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
        out.append(f"| {r['model']} | {r['fabric']} | {'yes' if r['zero'] else 'no'} | "
                   f"{r['tokens_per_gpu']:.0f} ({r['accumulation']}) | {ms(r['compute_s'])} | "
                   f"{ms(r['reduce_s'])} ({ms(r['exposed_reduce_s'])}) | {ms(r['allgather_s'])} | "
                   f"{ms(r['optimizer_s'])} | {ms(r['step_s'])} | {r['tokens_per_s'] / 1e3:.0f}k | "
                   f"{100 * r['comm_share']:.2f}% | {r['efficiency']:.3f} |")
    return "\n".join(out)


def check():
    """The model's own invariants and hand-worked cases."""
    m = MODELS["124M"]
    s = shape(m)
    assert s["params"] == 124475904, s["params"]  # GPT-2 124M with the padded vocabulary
    assert shape(MODELS["1.5B"])["params"] == 1557686400
    fab = FABRICS["8xH100 SXM, NVLink"]
    rate = 400e12
    one = step(m, dict(fab, gpus=1), rate)
    assert one["reduce_s"] == 0 and one["exposed_reduce_s"] == 0 and one["allgather_s"] == 0
    assert abs(one["compute_s"] - 524288 * s["flops_per_token"] / rate) < 1e-12
    # infinitely fast links hide nothing and cost nothing
    fast = step(m, dict(fab, busbw=1e30, alpha=0), rate)
    assert fast["exposed_reduce_s"] < 1e-12 and fast["reduce_s"] < 1e-12
    # a backward that takes no time hides nothing: the whole all-reduce is exposed, 2(N-1)/N of the gradients
    slow_links = dict(fab, alpha=0)
    inst = step(m, slow_links, 1e30)
    want = s["params"] * GRAD_BYTES * 2 * 7 / 8 / fab["busbw"]
    assert abs(inst["exposed_reduce_s"] - want) < 1e-9 and abs(inst["reduce_s"] - want) < 1e-9
    # with a long backward everything hides but the last two buckets, ready together when the backward ends:
    # layer 0 and the embeddings + head
    r = step(m, slow_links, rate)
    last = (s["layer_params"] + s["rest_params"]) * GRAD_BYTES * 2 * 7 / 8 / fab["busbw"]
    assert abs(r["exposed_reduce_s"] - last) < 1e-9, (r["exposed_reduce_s"], last)
    # ZeRO-1: 1/N of the optimizer, and an all-gather of every bf16 weight that nothing hides
    z = step(m, slow_links, rate, zero=True)
    assert abs(z["optimizer_s"] - r["optimizer_s"] / 8) < 1e-12
    assert abs(z["allgather_s"] - s["params"] * GRAD_BYTES / fab["busbw"]) < 1e-12
    # accumulation: 1.5B over 8 GPUs is 131072 tokens each in 8 micro-batches of 16 sequences
    assert step(MODELS["1.5B"], fab, rate)["accumulation"] == 8
    # the inversion gives back the published step time
    for case in LLMC:
        got = step(MODELS[case["model"]], case["fabric"], invert(case), hbm=case["hbm"])["step_s"]
        assert abs(got - case["step_s"]) < 1e-6 * case["step_s"], (case["name"], got)
    # anvil's own rate from gpu_train_bench.json: tokens/s times FLOPs per token, and the measured copy rate
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpu_train_bench.json")
        json.dump({"anvil": {"tokens_per_s": 500000}, "commit": "0123456789abcdef",
                   "config": {"layers": 12, "dim": 768, "vocab": 50304, "seq": 1024, "batch": 64},
                   "bench": [{"name": "copy_d2d", "measured": 2900.0, "unit": "GB/s"}],
                   "device": {"name": "NVIDIA H100 80GB HBM3"}}, open(path, "w"))
        got_rate, got_hbm, source = compute_from_json(path)
        assert abs(got_rate - 500000 * s["flops_per_token"]) < 1 and got_hbm == 2.9e12, (got_rate, got_hbm)
        assert "H100" in source and "0123456789" in source
    try:
        step(m, dict(fab, gpus=1024), rate)
        raise AssertionError("1024 GPUs at 524288 tokens should be refused")
    except ValueError:
        pass
    print("step_time_model: all checks passed")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compute-json", help="gpu_train_bench.json from bench/gpu_session.sh bench (anvil's rate)")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--check", action="store_true", help="run the model's own tests and exit")
    a = p.parse_args()
    if a.check:
        check()
        return
    published = []
    for case in LLMC:
        rate = invert(case)
        s = step(MODELS[case["model"]], case["fabric"], rate, hbm=case["hbm"])
        published.append(dict(name=case["name"], source=case["source"], step_s=case["step_s"], rate=rate,
                              mfu=rate / case["peak"], exposed_comm_s=s["exposed_reduce_s"],
                              compute_s=s["compute_s"], optimizer_s=s["optimizer_s"]))
    print("llm.c's published step times, split by the model:")
    for r in published:
        print(f"  {r['name']}: {r['step_s'] * 1e3:.0f} ms = compute {r['compute_s'] * 1e3:.1f} + exposed "
              f"all-reduce {r['exposed_comm_s'] * 1e3:.2f} + AdamW {r['optimizer_s'] * 1e3:.1f} ms; "
              f"{r['rate'] / 1e12:.0f} TFLOP/s per GPU = {100 * r['mfu']:.1f}% MFU  [{r['source']}]")
    if a.compute_json:
        rate, hbm, source = compute_from_json(a.compute_json)
    else:
        rate, hbm = published[1]["rate"], HBM_BYTES_S
        source = f"llm.c's GPT-2 1558M on 8xH100 ({rate / 1e12:.0f} TFLOP/s per GPU, inverted above)"
    print(f"\ncompute: {source}\n")
    rows = table(rate, hbm)
    print(markdown(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(compute_source=source, rate_flops=rate, hbm_bytes_s=hbm, fabrics=FABRICS,
                           models={k: dict(v, **shape(v)) for k, v in MODELS.items()}, published=published,
                           rows=rows, command=" ".join(sys.argv)), f, indent=2)


if __name__ == "__main__":
    main()
