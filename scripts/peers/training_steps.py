"""What Kiln's own training-step workloads (W9, W10) share: the W5 timing protocol and the
record they write, in the peers' harness format (bench_common.py)."""
import time

import bench_common as bc

WARMUP, STEPS = 10, 100


def timed_loop(step):
    """step() runs one full training step and returns only when its results are ready: the first
    call timed alone, WARMUP - 1 more, then STEPS timed one by one."""
    t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
    for _ in range(WARMUP - 1):
        step()
    samples = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return first, bc.summarize(samples)


def report(workload, name, case, first, summ, final_loss, loss0):
    bc.emit(workload, name, case, summ, unit="ms",
            extra={"first_step_s": first, "loss_after_110_steps": final_loss,
                   "initial_loss_f64": loss0})


def main(workload, fws, run):
    """Runs run(fw) for the framework named by --fw; a failure is recorded, then exits 1."""
    fw = bc.parse_fw(fws)
    try:
        run(fw)
    except Exception as e:
        import traceback; traceback.print_exc()
        bc.emit_error(workload, fw, "(whole run)", e)
        raise SystemExit(1)
