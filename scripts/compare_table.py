"""Writes the side-by-side comparison of one run of scripts/compare_peers.sh into BENCHMARKS.md:
Kiln's figure, the best peer's figure from the same run, their ratio and the issue's target,
then every record of the run (the peers' make_tables.py output).

usage: python compare_table.py RESULTS_DIR BENCHMARKS_MD
       python compare_table.py --drop-kiln RESULTS_DIR w2 w3 ...   (forget Kiln's records)
"""
import datetime
import json
import os
import platform
import subprocess
import sys

BEGIN = "<!-- peer comparison: begin (written by scripts/compare_table.py) -->"
END = "<!-- peer comparison: end -->"


def load(results, w):
    path = os.path.join(results, f"{w}.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def drop_kiln(results, workloads):
    for w in workloads + (["w7"] if "w5" in workloads else []):
        path = os.path.join(results, f"{w}.jsonl")
        if os.path.exists(path):
            keep = [r for r in load(results, w) if not r["framework"].startswith("kiln")]
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in keep)


def ok(records):
    return [r for r in records if r.get("status") == "ok"]


def best_peer(records, key, lower_is_better=True, case=None):
    peers = [r for r in ok(records) if not r["framework"].startswith("kiln")
             and key in r and (case is None or r["case"] == case)]
    if not peers:
        return None
    pick = min if lower_is_better else max
    return pick(peers, key=lambda r: r[key])


def kiln(records, framework, key, case_contains="", case=None):
    for r in ok(records):
        if r["framework"] == framework and case_contains in r["case"] and key in r \
                and (case is None or r["case"] == case):
            return r
    return None


def fmt(v, unit):
    if v is None:
        return "—"
    if abs(v) >= 100:
        s = f"{v:.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    elif abs(v) >= 0.1:
        s = f"{v:.2f}"
    else:
        s = f"{v:.3f}"
    return f"{s} {unit}"


def flagged(r, text):
    """`text`, marked when the run was disturbed by other processes (kept after 3 tries)."""
    return f"{text} [contended]" if r and r.get("contended") else text


def who(r):
    return f"{r['framework']} ({r['case']})" if r else "—"


def rows(results):
    """One row per target: (workload, Kiln 2 threads, Kiln 1 thread, best peer, ratio, target, met)."""
    out = []

    def timed(w, key, unit, target, target_text, case_contains="", absolute=None):
        recs = load(results, w)
        peer = best_peer(recs, key)
        k2 = kiln(recs, "kiln", key, case_contains)
        k1 = kiln(recs, "kiln_1thread", key, case_contains)
        ratio = peer[key] / k2[key] if peer and k2 else None
        if absolute is not None:
            met = k2 is not None and k2[key] <= absolute
        else:
            met = ratio is not None and ratio >= target
        out.append([w, case_contains or (k2["case"] if k2 else ""),
                    flagged(k2, fmt(k2 and k2[key], unit)), flagged(k1, fmt(k1 and k1[key], unit)),
                    f"{fmt(peer and peer[key], unit)} — {who(peer)}",
                    f"{ratio:.2f}×" if ratio else "—", target_text,
                    "yes" if met else "no"])

    timed("w2", "median", "ms", 3.0, "≥ 3× faster", "fresh output per call")
    timed("w2", "median", "ms", 3.0, "(reused output, reported)", "output buffer reused")
    out[-1][-1] = "—"
    timed("w3", "median", "ms", 3.0, "≥ 3× faster", "fresh output per call")
    timed("w3", "median", "ms", 3.0, "(reused output, reported)", "output buffer reused")
    out[-1][-1] = "—"
    recs = load(results, "w4")
    for case in sorted({r["case"] for r in ok(recs) if r["framework"] == "kiln"}):
        peer = best_peer(recs, "GFLOPs_median", lower_is_better=False, case=case)
        k2 = kiln(recs, "kiln", "GFLOPs_median", case=case)
        k1 = kiln(recs, "kiln_1thread", "GFLOPs_median", case=case)
        ratio = k2["GFLOPs_median"] / peer["GFLOPs_median"] if peer and k2 else None
        out.append(["w4", case, flagged(k2, fmt(k2 and k2["GFLOPs_median"], "GFLOP/s")),
                    flagged(k1, fmt(k1 and k1["GFLOPs_median"], "GFLOP/s")),
                    f"{fmt(peer and peer['GFLOPs_median'], 'GFLOP/s')} — {who(peer)}",
                    f"{ratio:.2f}×" if ratio else "—", "≥ 1.0×",
                    "yes" if ratio and ratio >= 1.0 else "no"])
    timed("w5", "median", "ms", 1.1, "≥ 1.1× faster")
    timed("w7", "first_call_s", "s", None, "≤ 0.05 s", absolute=0.05)
    timed("w6", "median", "µs", None, "≤ 0.1 µs", absolute=0.1)
    timed("w8", "median", "µs", None, "≤ 50 µs", absolute=50.0)
    timed("w9", "median", "ms", 1.5, "≥ 1.5× faster")
    timed("w10", "median", "ms", 1.3, "≥ 1.3× faster")
    timed("w11", "median", "ms", 1.2, "≥ 1.2× faster")
    timed("w12", "median", "s", 1.0, "ahead of the best peer")
    timed("w13", "median", "ms", 1.3, "≥ 1.3× faster")
    timed("w14", "median", "ms", 2.0, "≥ 2× faster")
    timed("w15", "median", "ms", 1.2, "≥ 1.2× faster and ≥ 60 % of the bandwidth bound")
    k2 = kiln(load(results, "w15"), "kiln", "median", "")
    if k2 is None or k2.get("fraction_of_bound", 0.0) < 0.6:
        out[-1][-1] = "no"
    return out


OWN = {
    "w9": "W9 digits CNN training step, batch 256, SGD",
    "w10": "W10 recurrent network training step: 64 steps of a 256-wide tanh cell, batch 64, SGD",
    "w11": "W11 transformer training step: 2 pre-norm encoder layers (width 256, 4 causal heads, "
           "feed-forward 1024, GELU), 16 sequences of 128 tokens, Adam",
    "w12": "W12 an epoch of the Fashion-MNIST CNN, data loading included, batch 64, Adam",
    "w13": "W13 the GPT recipe's training step: 4 layers, width 128, 4 heads, context 64, "
           "batch 12, clipping, AdamW on a warm-up and cosine",
    "w14": "W14 greedy decoding through a KV cache: 256 tokens after a 64-token prompt, batch 1, "
           "the GPT recipe's model (4 layers, width 128, context 320)",
    "w15": "W15 W14's decoding for a GPT-2-124M-shaped model (12 layers, width 768, 12 heads, "
           "vocabulary 50,257, context 1,024)",
}


def own_records(results, w):
    """W9–W15 are Kiln's own workloads, which the peers' make_tables.py does not know: their
    records."""
    if w == "w12":
        return records_table(
            results, w, "3 epochs, each timed",
            ["s/epoch median (min..max)", "reading the files", "mean loss, epoch 3",
             "test accuracy"],
            lambda r: [fmt(r.get("load_s"), "s"), f"{r['mean_loss_last_epoch']:.4f}",
                       f"{100 * r['test_accuracy']:.1f} %"])
    if w in ("w14", "w15"):
        # The first tokens made: from the same weights, the same where the arithmetic agrees.
        table = records_table(
            results, w, "10 timed generations after 2",
            ["ms/token median (min..max)", "first generation", "tokens/s", "first tokens"],
            lambda r: [fmt(r.get("first_generation_s"), "s"), f"{r['tokens_per_s']:.0f}",
                       " ".join(str(t) for t in r.get("first_tokens", [])[:8])])
        return table + bandwidth_bound(load(results, w))
    # W13 trains on one batch from the same weights: its first loss checks the start.
    first = (lambda r: [f"{r['first_loss']:.6f}"]) if w == "w13" else (lambda r: [])
    return records_table(
        results, w, "100 timed steps after 10 warm-up",
        ["ms/step median (min..max)", "first step", "loss after 110 steps"]
        + (["first loss"] if w == "w13" else []),
        lambda r: [fmt(r.get("first_step_s"), "s"), f"{r['loss_after_110_steps']:.6f}"]
        + first(r))


def bandwidth_bound(records):
    """Kiln's measure of the machine's memory bandwidth and the tokens/s it bounds, if its
    record has them (W15)."""
    k = next((r for r in ok(records) if "stream_copy_gb_s" in r), None)
    if k is None:
        return []
    return ["", f"Memory-bandwidth bound: {k['weight_bytes_per_token'] / 1e6:.0f} MB of weights "
            f"a token at the STREAM copy rate measured by Kiln's run, "
            f"{k['stream_copy_gb_s']:.1f} GB/s: {k['bound_tokens_per_s']:.1f} tokens/s; Kiln "
            f"reached {100 * k['fraction_of_bound']:.0f} % of it."]


def records_table(results, w, protocol, header, cells):
    """Workload `w`'s records as a table: framework, variant, the median (min..max) under
    `header[0]`, then `cells(record)` under the rest; failed runs with their errors."""
    bare = lambda v: fmt(v, "").strip()  # noqa: E731
    records = load(results, w)
    rows = [[r["framework"], r["case"],
             f"{bare(r['median'])} ({bare(r['min'])}..{bare(r['max'])})"
             + (" [contended]" if r.get("contended") else "")] + cells(r)
            for r in ok(records)]
    rows += [[r["framework"], r.get("case", ""), "FAILED: " + r.get("error", "")]
             + [""] * (len(header) - 1)
             for r in records if r.get("status") != "ok"]
    header = ["framework", "variant"] + header
    lines = [f"### {OWN[w]} ({protocol})",
             "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def machine():
    model = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = ""
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            mem = f", {int(line.split()[1]) / 2**20:.0f} GiB"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return f"{model}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}; " \
           f"Kiln at commit {commit}"


def section(results):
    header = ["workload", "case", "Kiln (2 threads)", "Kiln (1 thread)", "best peer, same run",
              "speed-up vs best peer", "target", "met"]
    lines = [BEGIN, "",
             f"Run of {datetime.date.today().isoformat()} on {machine()}.",
             "Command: `scripts/compare_peers.sh` (peers first, each in its own process after "
             "waiting for an idle machine, then Kiln's `examples/peer_workloads.rs` on all cores "
             "and with `RAYON_NUM_THREADS=1`, under the same guard: a run that other processes "
             "disturbed is retried, and flagged [contended] if all three tries were).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows(results)]
    tables = os.path.join(results, "tables.md")
    if os.path.exists(tables):
        lines += ["", "<details><summary>Every record of this run (the peers' make_tables.py, "
                  "and Kiln's own workloads')</summary>", "", open(tables).read().strip(), ""]
        for w in OWN:
            lines += own_records(results, w) + [""]
        lines += ["</details>"]
    lines += ["", END]
    return "\n".join(lines)


def main():
    if sys.argv[1] == "--drop-kiln":
        drop_kiln(sys.argv[2], sys.argv[3:])
        return
    results, target = sys.argv[1:3]
    text = open(target).read() if os.path.exists(target) else "# Benchmarks\n"
    new = section(results)
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + new + text[end:]
    else:
        text = text.rstrip() + "\n\n## Side by side with the peers\n\n" + new + "\n"
    with open(target, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
