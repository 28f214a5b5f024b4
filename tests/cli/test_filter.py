"""anvil data filter: the Gopher rules drop the records that break them and keep clean prose as written; a
reference model's perplexity quantiles drop the share asked for, the least likely records (here the
corrupted ones) first; every record's scores are written; bad input is a one-line error that writes nothing."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
from common import check, run  # noqa: E402

NOUNS = ["model", "data", "token", "layer", "batch", "record", "file", "step", "value", "network"]
VERBS = ["reads", "writes", "keeps", "trains", "checks", "scores", "moves", "holds"]


def sentence(rnd):
    return (f"the {rnd.choice(NOUNS)} {rnd.choice(VERBS)} the {rnd.choice(NOUNS)} of the {rnd.choice(NOUNS)} "
            f"and that {rnd.choice(NOUNS)} {rnd.choice(VERBS)} with care.")


def clean(rnd):
    return " ".join(sentence(rnd) for _ in range(6))  # about 80 words


def corrupted(rnd, kind):
    if kind == "noise":  # letters at random: long words, no stop words
        return " ".join("".join(rnd.choice("qxzjkvw") for _ in range(rnd.randint(11, 16))) for _ in range(70))
    if kind == "symbols":  # hashtags
        return " ".join(f"#{rnd.choice(NOUNS)}" for _ in range(70))
    return " ".join(str(rnd.randint(0, 99999)) for _ in range(70))  # numbers: no alphabetic words


def main():
    f = []
    rnd = random.Random(3)
    with common.TempDir() as d:
        recs, bad = [], set()
        for i in range(200):
            if i % 5 == 4:
                recs.append({"text": corrupted(rnd, ["noise", "symbols", "digits"][i % 3]), "id": i})
                bad.add(i + 1)  # its line
            else:
                recs.append({"text": clean(rnd), "id": i})
        data = os.path.join(d, "mixed.jsonl")
        with open(data, "w") as fh:
            for r in recs:
                fh.write(json.dumps(r) + "\n")
        out, scores = os.path.join(d, "kept.jsonl"), os.path.join(d, "scores.jsonl")
        r = run(["data", "filter", "--in", data, "--out", out, "--heuristics", "gopher", "--scores", scores],
                check=True)
        kept = open(out).read().splitlines()
        sc = [json.loads(x) for x in open(scores)]
        want = [x for i, x in enumerate(open(data).read().splitlines()) if i + 1 not in bad]
        check(kept == want, f"gopher drops the 40 corrupted records, keeps the 160 clean ones as written "
                            f"({r.stdout.strip()})", f)
        check(len(sc) == 200 and all(s["kept"] == (s["line"] not in bad) for s in sc)
              and all(s["gopher"] for s in sc if s["line"] in bad),
              "the scores name each record's broken rules", f)
        # a reference model trained on clean prose: the least likely 20% are dropped
        ref_text = os.path.join(d, "ref.txt")
        with open(ref_text, "w") as fh:
            fh.write("\n".join(clean(rnd) for _ in range(300)))
        ref = os.path.join(d, "ref")
        run(["train", "--data", ref_text, "--out", ref, "--steps", "60", "--layers", "2", "--heads", "2", "--dim",
             "32", "--seq", "64", "--batch", "8", "--lr", "3e-3", "--threads", "2"], check=True, timeout=300)
        r = run(["data", "filter", "--in", data, "--out", out, "--ppl-model", os.path.join(ref, "final"),
                 "--keep-quantiles", "0,0.8", "--scores", scores, "--threads", "2"], check=True, timeout=120)
        sc = [json.loads(x) for x in open(scores)]
        dropped = {s["line"] for s in sc if not s["kept"]}
        check(len(open(out).read().splitlines()) == 160 and len(dropped) == 40 and all("perplexity" in s for s in sc),
              f"--keep-quantiles 0,0.8 keeps 80% ({r.stdout.strip()})", f)
        check(len(dropped & bad) >= 36, f"the dropped fifth is the corrupted records ({len(dropped & bad)} of 40)", f)
        # bad input
        never = os.path.join(d, "never.jsonl")
        for args, want_err, what in [
            (["--keep-quantiles", "0,0.9"], "needs --ppl-model", "quantiles without a model"),
            (["--ppl-model", os.path.join(ref, "final"), "--keep-quantiles", "0.9,0.1"], "LO,HI", "bad quantiles"),
            (["--heuristics", "gopher", "--min-words", "1000"], "no record kept", "nothing kept"),
            (["--heuristics", "c4"], "use gopher or none", "an unknown rule set"),
        ]:
            r = run(["data", "filter", "--in", data, "--out", never, *args])
            err = r.stderr.strip().splitlines()
            check(r.returncode != 0 and err and want_err in err[-1] and common.ONE_LINE_ERROR.match(err[-1])
                  and not os.path.exists(never), f"{what}: {err[-1] if err else ''}", f)
    return common.report(f)


if __name__ == "__main__":
    sys.exit(main())
