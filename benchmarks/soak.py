"""A soak of the fault catalogue (docs/reference/faults.md): sweeps of the fake vLLM
(tests/fakes/fake_vllm.py) for a set time, each point meeting a fault drawn at random (seeded),
the planner itself SIGKILLed or SIGTERMed at random instants and resumed. Outside CI: the hour
it is meant to run is its point.

Each round is one sweep of POINTS points, each point's server given a fault of the catalogue
(FAKE_VLLM_FAULT, or a death after N requests, or none) beginning after a random number of
requests. The planner runs as a process, as an operator runs it; with some probability it is
SIGKILLed or SIGTERMed at a random instant and the same command runs again with --resume, until
it ends by itself. At the end of every round it checks:

  - every point ended classified: status ok, infeasible or failed with a failure kind (never
    pending or running);
  - sweep.json is valid, and every point seen finished in a killed run's file is in the final
    file byte for byte (the bytes of any that are not count as lost);
  - no server process of the round, and no planner, is left in the process table;
  - the lock file is gone.

And over the run, per planner process (sampled every SAMPLE_S from /proc): peak RSS and open
file descriptors, the first rounds' against the last rounds', for growth without bound.

    python benchmarks/soak.py --duration-s 3600 [--seed 32] [--report soak.json]

It prints a line per round, then one JSON object (and writes it to --report): faults injected
by kind, points by status and kind, bytes lost (and the fields by which the changed points
differed), leaked processes, peak RSS and descriptors at the start and the end, and `ok`, false
when any check failed (exit status 1).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.sweep.lock import LOCK_FILE  # noqa: E402
from planner.sweep.results import SweepResults  # noqa: E402
from tests.fakes.fault_sweeps import fake_vllm_processes, wait_until_gone, write_fault_config  # noqa: E402

POINTS = 6
SAMPLE_S = 0.5
# The faults of the fake's FAKE_VLLM_FAULT, a death after N requests, and a healthy server.
SERVER_FAULTS = ["stop", "hang", "stall", "oom", "metrics_gone", "metrics_garbage", "die", "none"]
# What happens to the planner in one run: nothing, SIGKILL or SIGTERM at a random instant.
PLANNER_FAULTS = ["none", "none", "sigkill", "sigterm"]
FINISHED = {"ok", "infeasible", "predicted_infeasible"}


class Sampler:
    """Peak RSS (KiB) and open descriptors of one process, sampled from /proc until it ends."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_kib = 0
        self.fds = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        proc = Path(f"/proc/{self.pid}")
        while True:
            try:
                for line in (proc / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss_kib = max(self.rss_kib, int(line.split()[1]))
                self.fds = max(self.fds, len(os.listdir(proc / "fd")))
            except (OSError, ValueError):
                return
            time.sleep(SAMPLE_S)

    def join(self) -> None:
        self._thread.join(timeout=5)


def planner_processes(out: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in ps.splitlines() if "planner sweep" in line and str(out) in line and " Z" not in line]


def round_config(folder: Path, rng: random.Random, faults: list[str]) -> Path:
    """A sweep whose points' servers meet `faults`, one each (the point's [grid.env] axis)."""
    env_faults = [f if f not in ("none", "die") else "" for f in faults]
    # A point's env axis is its fault; a death after N requests rides on the same axis's value.
    die = [str(rng.randint(30, 90)) if f == "die" else "0" for f in faults]
    labels = [f"{i:02d}-{f}" for i, f in enumerate(faults)]
    cfg = write_fault_config(
        folder,
        kv_bytes=["4M"],
        env={"FAKE_VLLM_FAULT_AFTER_REQUESTS": str(rng.randint(10, 80))},
        request_timeout_s=6,
        slo="tpot_p50_ms = 37\nerror_rate = 0",
    )
    # One point per fault: the axes are zipped by hand into one env axis of JSON-free values.
    axis = "[grid.env]\nSOAK_POINT = " + json.dumps(labels)
    text = cfg.read_text().replace("[replay]", axis + "\n\n[replay]", 1)
    cfg.write_text(text)
    # The fake reads the point's own fault from a small wrapper: SOAK_POINT names it.
    wrapper = folder / "fake_with_fault.py"
    table = {label: {"FAKE_VLLM_FAULT": ef, "FAKE_VLLM_DIE_AFTER_REQUESTS": d} for label, ef, d in zip(labels, env_faults, die)}
    wrapper.write_text(
        "import json, os, runpy, sys\n"
        f"TABLE = json.loads({json.dumps(json.dumps(table))})\n"
        "for k, v in TABLE.get(os.environ.get('SOAK_POINT'), {}).items():\n"
        "    if v and v != '0':\n"
        "        os.environ[k] = v\n"
        # argv[1] is the literal "fake_vllm.py", there for the process table's sake.
        f"sys.argv = [{json.dumps(str(ROOT / 'tests' / 'fakes' / 'fake_vllm.py'))}] + sys.argv[2:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    fake = json.dumps(str(ROOT / "tests" / "fakes" / "fake_vllm.py"))
    cfg.write_text(cfg.read_text().replace(f", {fake}]", f", {json.dumps(str(wrapper))}, \"fake_vllm.py\"]", 1))
    return cfg


def run_round(cfg: Path, out: Path, rng: random.Random, tally: dict) -> dict:
    """One sweep to its end, through random planner faults; what the checks found."""
    finished: dict[str, str] = {}
    lost_bytes = 0
    rss: list[int] = []
    fds: list[int] = []
    resume: list[str] = []
    for _ in range(20):
        action = rng.choice(PLANNER_FAULTS)
        proc = subprocess.Popen(
            [sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(out), *resume],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        sampler = Sampler(proc.pid)
        if action != "none":
            try:
                proc.wait(timeout=rng.uniform(1.0, 40.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL if action == "sigkill" else signal.SIGTERM)
                tally["planner_" + action] += 1
        try:
            status = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
            tally["planner_hung"] += 1
        sampler.join()
        rss.append(sampler.rss_kib)
        fds.append(sampler.fds)
        wait_until_gone(lambda: fake_vllm_processes(cfg), 30)
        results = SweepResults.model_validate_json((out / "sweep.json").read_bytes()) if (out / "sweep.json").exists() else None
        if results is not None:
            for p in results.points:
                dumped = p.model_dump_json()
                if p.id in finished and finished[p.id] != dumped:
                    lost_bytes += len(finished[p.id])
                    before, after = json.loads(finished[p.id]), json.loads(dumped)
                    tally["changed_fields"].update(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
                if p.status in FINISHED:
                    finished[p.id] = dumped
        resume = ["--resume"]
        if status == 0:
            break
    final = SweepResults.model_validate_json((out / "sweep.json").read_bytes())
    unclassified = [p.id for p in final.points if p.status in ("pending", "running") or (p.status == "failed" and p.failure is None)]
    leaked = fake_vllm_processes(cfg) + planner_processes(out)
    for p in final.points:
        tally["points"][f"{p.status}:{p.failure.kind if p.failure else '-'}"] += 1
        tally["metrics_lost_notes"] += any(n.startswith("metrics_lost:") for n in p.notes)
    return {
        "unclassified": unclassified,
        "lost_bytes": lost_bytes,
        "leaked": leaked,
        "lock_left": (out / LOCK_FILE).exists(),
        "rss_kib": max(rss),
        "fds": max(fds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tally: dict = collections.defaultdict(int)
    tally["points"] = collections.Counter()
    tally["changed_fields"] = collections.Counter()
    injected: collections.Counter = collections.Counter()
    rounds: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        n = 0
        while time.monotonic() - started < args.duration_s:
            faults = [rng.choice(SERVER_FAULTS) for _ in range(POINTS)]
            injected.update(f for f in faults if f != "none")
            folder = Path(tmp) / f"round{n:03d}"
            cfg = round_config(folder, rng, faults)
            rounds.append(run_round(cfg, folder / "out", rng, tally))
            # A line a round, so a long run shows how it goes (and what it found) before its end.
            print(f"round {n}: {time.monotonic() - started:.0f} s, bytes lost {rounds[-1]['lost_bytes']},"
                  f" leaked {len(rounds[-1]['leaked'])}, unclassified {len(rounds[-1]['unclassified'])}", flush=True)
            n += 1
    third = max(1, len(rounds) // 3)
    first, last = rounds[:third], rounds[-third:]
    figures = {
        "seed": args.seed,
        "duration_s": round(time.monotonic() - started, 1),
        "rounds": len(rounds),
        "faults_injected": {**dict(injected), **{k: v for k, v in tally.items() if k.startswith("planner_")}},
        "points": dict(tally["points"]),
        "points_noting_metrics_lost": tally["metrics_lost_notes"],
        "unclassified_points": sum(len(r["unclassified"]) for r in rounds),
        "bytes_lost": sum(r["lost_bytes"] for r in rounds),
        # The fields by which a finished point differed on --resume (what the lost bytes were).
        "changed_fields": dict(tally["changed_fields"]),
        "leaked_processes": sum(len(r["leaked"]) for r in rounds),
        "locks_left": sum(r["lock_left"] for r in rounds),
        "peak_rss_mib_start": round(max(r["rss_kib"] for r in first) / 1024, 1),
        "peak_rss_mib_end": round(max(r["rss_kib"] for r in last) / 1024, 1),
        "open_fds_start": max(r["fds"] for r in first),
        "open_fds_end": max(r["fds"] for r in last),
    }
    figures["ok"] = (
        figures["unclassified_points"] == 0
        and figures["bytes_lost"] == 0
        and figures["leaked_processes"] == 0
        and figures["locks_left"] == 0
        and tally["planner_hung"] == 0
        # Growth without bound would show as the last rounds' planners well above the first's.
        and figures["peak_rss_mib_end"] <= 1.5 * figures["peak_rss_mib_start"] + 32
        and figures["open_fds_end"] <= figures["open_fds_start"] + 8
    )
    text = json.dumps(figures, indent=2)
    print(text)
    if args.report is not None:
        args.report.write_text(text + "\n")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
