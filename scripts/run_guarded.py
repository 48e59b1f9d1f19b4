"""Runs Kiln's benchmark runner the way the peers' run_one.py runs their scripts: after waiting
for an idle machine, with the CPU time of other processes watched; a run they disturbed (over
5 % of the two cores) is discarded and retried, up to 3 tries, the last kept and flagged.

usage: python run_guarded.py PEERS_DIR RESULTS_DIR -- COMMAND ... (COMMAND gets --out SCRATCH)
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def main():
    peers, results = sys.argv[1:3]
    command = sys.argv[sys.argv.index("--") + 1:]
    sys.path.insert(0, os.path.abspath(peers))
    import run_one  # the peers' own idle wait and CPU accounting

    for attempt in range(1, 4):
        run_one.wait_quiet()
        scratch = tempfile.mkdtemp(prefix="kiln_bench_")
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        b0, _ = run_one.busy_idle()
        t0 = time.time()
        rc = subprocess.call(command + ["--out", scratch])
        wall = time.time() - t0
        b1, _ = run_one.busy_idle()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        foreign = max(0.0, (b1 - b0) / run_one.HZ - own)
        foreign_pct = 100.0 * foreign / (wall * run_one.NCPU)
        ok = foreign_pct <= 5.0 and rc == 0
        print(f"kiln try {attempt}: rc={rc} wall={wall:.1f}s foreign={foreign_pct:.1f}%", flush=True)
        if ok or attempt == 3:
            for name in os.listdir(scratch):
                with open(os.path.join(scratch, name)) as fi, \
                        open(os.path.join(results, name), "a") as fo:
                    for line in fi:
                        record = json.loads(line)
                        record["foreign_cpu_pct"] = round(foreign_pct, 1)
                        if not ok:
                            record["contended"] = True
                        fo.write(json.dumps(record) + "\n")
            shutil.rmtree(scratch, ignore_errors=True)
            return rc
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
