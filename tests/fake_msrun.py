"""A stand-in for msrun (no MindSpore) to test the launcher's signal handling in seconds.

    python fake_msrun.py drive LOG_DIR MODE GRACE [HANG_S]   run hyperparallel.launch.launch() on 2 fake ranks
                                                    (the hang watchdog on with HANG_S); print its result as
                                                    JSON (the test signals this process)
    python fake_msrun.py msrun --flag=v... SCRIPT JOB    what launch() starts: 2 ranks, each in a session
                                                    of its own with MS_ROLE=MS_WORKER, and a ``tail -f`` of
                                                    each rank's log in its own process group, as msrun does
    python fake_msrun.py rank R LOG_DIR MODE JOB    one rank: MODE ``ignore`` ignores SIGTERM and SIGINT (a
                                                    step that never ends), ``stop`` stops cleanly on them (rank 0 prints
                                                    the ``stopped on signal`` line), ``done`` finishes its job
                                                    after 2 s (``done_<rank>``) and then never exits (a
                                                    teardown that does not end; msrun waits for it);
                                                    ``blockedS`` beats (heartbeats, moving) until LOG_DIR/freeze
                                                    exists, then rank S's peer blocks in a send to S and, 0.3 s
                                                    later, rank S in a receive from its peer (the heartbeats of
                                                    a SIGSTOP of rank S), and waits for ever
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def rank(r: int, log_dir: str, mode: str) -> None:
    sys.stdout = open(os.path.join(log_dir, f"worker_{r}.log"), "a", buffering=1)
    print(f"hyperparallel worker rank {r} pid {os.getpid()}")

    def on_term(signum, frame):
        if mode == "stop":
            if r == 0:   # names the signal it got, as a real rank's StopRequest does
                from hyperparallel.runtime.stop import STOPPED
                print(f"{STOPPED}{signal.Signals(signum).name} after step 3/9; no --save-dir: nothing saved")
            sys.exit(0)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_term if mode == "stop" else signal.SIG_IGN)
    if mode.startswith("blocked"):
        blocked(r, log_dir, int(mode[len("blocked"):]))
    t0 = time.time()
    while True:
        time.sleep(0.05)
        if mode == "done" and time.time() - t0 > 2.0 and not os.path.exists(os.path.join(log_dir, f"done_{r}")):
            if r == 0:
                print("job finished")
            with open(os.path.join(log_dir, f"done_{r}"), "w") as f:
                f.write(str(os.getpid()))


def blocked(r: int, log_dir: str, s: int) -> None:
    """Heartbeats moving until ``LOG_DIR/freeze``; then the rank's last one (see the module docstring)."""
    from hyperparallel.watch import Heartbeat
    hb, peer = Heartbeat(log_dir, r), 1 - r
    while not os.path.exists(os.path.join(log_dir, "freeze")):
        hb.beat(3, "F", 2, 24, (), "llm/0 micro 0")
        time.sleep(0.1)
    if r == s:
        time.sleep(0.3)
        hb.beat(3, "RECV", 12, 24, [peer], f"llm/0 micro 2 act from rank {peer}")
    else:
        hb.beat(3, "SEND", 11, 24, [s], f"llm/0 micro 2 act to rank {s}")
    while True:
        time.sleep(1)


def msrun(argv) -> int:
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--"))
    log_dir, mode = flags["log_dir"], os.environ.get("HP_FAKE_RANK", "ignore")
    env = dict(os.environ, MS_ROLE="MS_WORKER")
    job = argv[-1]   # a rank's command line holds the job file, as msrun's do (the launcher looks for it)
    procs, tails = [], []
    for r in range(int(flags["worker_num"])):
        procs.append(subprocess.Popen([sys.executable, HERE, "rank", str(r), log_dir, mode, job], env=env,
                                      start_new_session=True))
        log = os.path.join(log_dir, f"worker_{r}.log")
        open(log, "a").close()
        tails.append(subprocess.Popen(["tail", "-f", log]))   # msrun's log followers: its children, its group
    code = max(p.wait() for p in procs)
    for t in tails:
        t.kill()
    return code   # SIGTERM kills this process (default action), not the ranks


def drive(log_dir: str, mode: str, grace: float, hang_s=None) -> None:
    import hyperparallel.launch as L
    L.msrun_path = lambda: [sys.executable, HERE, "msrun"]
    os.environ["HP_FAKE_RANK"] = mode
    res = L.launch({"cases": []}, 2, log_dir, timeout_s=60, echo=False, stop_grace_s=grace, hang_timeout_s=hang_s)
    print(json.dumps({"returncode": res.returncode, "stopped": res.stopped, "killed": res.killed,
                      "message": res.message, "msrun_gone": res.msrun_gone, "hung": res.hung}), flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "rank":
        rank(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif cmd == "msrun":
        sys.exit(msrun(sys.argv[2:]))
    else:
        drive(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]) if len(sys.argv) > 5 else None)
