#!/usr/bin/env python3
"""Fault tests: a rank killed (SIGKILL) or stopped (SIGSTOP) mid-allreduce or
mid-join. Survivors must fail within timeout + 5 s with an error naming the
lost rank, and nothing may be left in /dev/shm.

usage: faults.py WORKER SCENARIO [MPIEXEC]
scenarios: shm-kill-allreduce shm-stop-allreduce shm-stop-allreduce-staggered shm-kill-creator-join
           shm-kill-rank-join mpi-stop-allreduce mpi-kill-allreduce
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT_MS = 3000
SLACK_S = 5.0


def shm_entries():
    return set(glob.glob("/dev/shm/gradsync-*"))


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_for(proc, text, limit=60.0):
    """Reads proc's stdout until a line contains text."""
    end = time.time() + limit
    while time.time() < end:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise SystemExit(f"FAIL: rank exited ({proc.returncode}) before '{text}'")
            continue
        if text in line:
            return
    raise SystemExit(f"FAIL: no '{text}' within {limit} s")


def start(worker, d, rank, size, steps=100000, env=None, timeout_ms=TIMEOUT_MS):
    return subprocess.Popen([worker, "shm", d, str(rank), str(size), str(timeout_ms), str(steps)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def expect_failures(procs, t0, limit_s, must_name):
    """Every process in procs exits 3 before t0 + limit_s, its stderr naming must_name."""
    for p in procs:
        left = t0 + limit_s - time.time()
        try:
            p.wait(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            raise SystemExit(f"FAIL: a survivor still ran {limit_s:.1f} s after the fault")
        err = p.stderr.read()
        print(f"  survivor exit {p.returncode} after {time.time() - t0:.2f} s: {err.strip()}")
        if p.returncode != 3:
            raise SystemExit(f"FAIL: survivor exit code {p.returncode}, want 3 (a gradsync::error)")
        if must_name not in err:
            raise SystemExit(f"FAIL: survivor's error does not name '{must_name}'")


def check_shm_clean(before):
    left = shm_entries() - before
    if left:
        for f in left:
            os.unlink(f)
        raise SystemExit(f"FAIL: left in /dev/shm: {sorted(left)}")
    print("  /dev/shm: nothing left")


def shm_allreduce(worker, sig, stagger=False):
    """stagger: rank 2 waits twice as long as rank 0, so rank 0 gives up and
    leaves first and rank 2 may fail on that departure rather than on its own
    timeout; its error must still name the stopped rank 1."""
    before = shm_entries()
    with tempfile.TemporaryDirectory() as d:
        procs = [start(worker, d, r, 3, timeout_ms=TIMEOUT_MS * (2 if stagger and r == 2 else 1))
                 for r in range(3)]
        for p in procs:
            wait_for(p, "step 3")
        victim = procs[1]
        os.kill(victim.pid, sig)
        t0 = time.time()
        # Stopped ranks are alive: only the timeout ends the wait.
        limit = (TIMEOUT_MS * (2 if stagger else 1) / 1000.0 if sig == signal.SIGSTOP else 0) + SLACK_S
        try:
            expect_failures([procs[0], procs[2]], t0, limit, "rank 1")
        finally:
            if sig == signal.SIGSTOP:
                victim.kill()
            victim.wait()
    check_shm_clean(before)


def shm_kill_creator_join(worker):
    before = shm_entries()
    env = dict(os.environ, GRADSYNC_SHM_JOIN_TIMEOUT_MS=str(TIMEOUT_MS))
    with tempfile.TemporaryDirectory() as d:
        creator = start(worker, d, 0, 3, env=env)
        file = os.path.join(d, "gradsync-shm.rendezvous")
        end = time.time() + 30
        while not os.path.exists(file) and time.time() < end:
            time.sleep(0.01)
        if not os.path.exists(file):
            raise SystemExit("FAIL: rank 0 published no rendezvous file")
        os.kill(creator.pid, signal.SIGKILL)  # in its join, waiting for ranks 1 and 2
        creator.wait()
        t0 = time.time()
        procs = [start(worker, d, r, 3, env=env) for r in (1, 2)]
        expect_failures(procs, t0, TIMEOUT_MS / 1000.0 + SLACK_S, "rank")
    check_shm_clean(before)


def shm_kill_rank_join(worker):
    before = shm_entries()
    env = dict(os.environ, GRADSYNC_SHM_JOIN_TIMEOUT_MS=str(TIMEOUT_MS * 10))
    with tempfile.TemporaryDirectory() as d:
        r0 = start(worker, d, 0, 3, env=env)
        r1 = start(worker, d, 1, 3, env=env)
        time.sleep(1.0)  # both attached, waiting in the join for rank 2
        os.kill(r1.pid, signal.SIGKILL)
        r1.wait()
        t0 = time.time()
        expect_failures([r0], t0, SLACK_S, "rank 1")
    check_shm_clean(before)


def mpi_allreduce(worker, mpiexec, sig):
    with tempfile.TemporaryDirectory() as reports:
        mpi_allreduce_in(worker, mpiexec, sig, reports)


def mpi_allreduce_in(worker, mpiexec, sig, reports):
    # The ranks also write their errors to REPORTS: mpiexec may stop
    # forwarding stderr once the session's MPI_Abort ends the job.
    job = subprocess.Popen([mpiexec, "-n", "3", worker, "mpi", reports, "-", "-", str(TIMEOUT_MS), "100000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(job, "step 3")
    time.sleep(0.2)
    # The worker processes are mpiexec's grandchildren: find rank 1's by its argv.
    pids = subprocess.run(["pgrep", "-f", f"{worker} mpi"], capture_output=True, text=True).stdout.split()
    pids = sorted(int(p) for p in pids if int(p) != job.pid and "mpiexec" not in open(f"/proc/{p}/cmdline").read())
    if len(pids) != 3:
        job.kill()
        raise SystemExit(f"FAIL: found {len(pids)} worker processes")
    os.kill(pids[1], sig)
    t0 = time.time()
    limit = TIMEOUT_MS / 1000.0 + SLACK_S
    # The survivors must be gone in time (a stopped rank keeps mpiexec itself
    # waiting, so the job's own end is not the measure).
    survivors = [pids[0], pids[2]]
    while time.time() < t0 + limit and any(alive(p) for p in survivors):
        time.sleep(0.05)
    late = [p for p in survivors if alive(p)]
    gone_after = time.time() - t0
    if sig == signal.SIGSTOP:
        try:
            os.kill(pids[1], signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        out, err = job.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
    if late:
        for p in late:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise SystemExit(f"FAIL: survivors {late} still ran {limit:.1f} s after the fault; stderr: {err[-600:]}")
    print(f"  survivors gone {gone_after:.2f} s after the fault")
    print(f"  job exit {job.returncode} after {time.time() - t0:.2f} s; stderr: {err.strip()[-600:]}")
    if job.returncode == 0:
        raise SystemExit("FAIL: the job succeeded although a rank was lost")
    reported = ""
    for path in sorted(glob.glob(os.path.join(reports, "rank*.err"))):
        with open(path) as f:
            reported += f"{os.path.basename(path)}: {f.read().strip()}\n"
    print(f"  survivors' reports: {reported.strip() or '(none)'}")
    if sig == signal.SIGSTOP and "timeout" not in err and "kind=timeout" not in reported:
        raise SystemExit("FAIL: survivors did not report a timeout")


def main():
    worker, scenario = os.path.abspath(sys.argv[1]), sys.argv[2]
    print(f"scenario {scenario}")
    if scenario == "shm-kill-allreduce":
        shm_allreduce(worker, signal.SIGKILL)
    elif scenario == "shm-stop-allreduce":
        shm_allreduce(worker, signal.SIGSTOP)
    elif scenario == "shm-stop-allreduce-staggered":
        shm_allreduce(worker, signal.SIGSTOP, stagger=True)
    elif scenario == "shm-kill-creator-join":
        shm_kill_creator_join(worker)
    elif scenario == "shm-kill-rank-join":
        shm_kill_rank_join(worker)
    elif scenario == "mpi-stop-allreduce":
        mpi_allreduce(worker, sys.argv[3], signal.SIGSTOP)
    elif scenario == "mpi-kill-allreduce":
        mpi_allreduce(worker, sys.argv[3], signal.SIGKILL)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print("PASS")


if __name__ == "__main__":
    main()
