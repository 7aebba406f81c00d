"""Load engine accuracy and single-core throughput, next to httperf, wrk and Locust.

Target: a real HAProxy on 127.0.0.1 (free port) answering every request itself with
`http-request return status 200 ... string ok`, one thread pinned to CPU 0, so the target is never
the bottleneck. Every client (the engine in this process, httperf, wrk, Locust) is pinned to CPU 1.

1. Accuracy, open loop at 100, 1000 and 5000 req/s (--seconds each): achieved rate vs plan and
   p50. References at the same rates:
   - httperf --hog --num-calls 1: a new connection per request. It has no reply-time percentile;
     "Reply time [ms]: response" is the *mean* time from sending the request to the first reply
     byte, printed to 0.1 ms, and "Connection time median" uses 1 ms bins. So on loopback, where
     a reply takes ~0.1 ms, httperf can only tell the engine's p50 is the same order of magnitude.
   - wrk paced by a Lua delay() (keep-alive, ~100 req/s per connection): wrk's latency
     percentiles have microsecond resolution and measure send -> response like the engine, so
     its p50 is the like-for-like check. (wrk paces per connection after each response, so its
     rate is approximate; it is a latency reference, not a rate one.)
2. Throughput on one core: engine closed loop with 50 users, `wrk -t1 -c50`, and Locust
   FastHttpUser headless in one process with 50 users.

    python tests/bench/bench_loadgen.py [--seconds 3] [--rounds 3] [--throughput-seconds 5]

The machine is shared, so each accuracy rate runs the engine and paced wrk interleaved --rounds
times and compares median p50s; throughput keeps the best of --throughput-rounds runs per tool.

Last line: RESULT engine_rps=... wrk_rps=... locust_rps=... rate_error_pct=... p50_vs_wrk_pct=...
p50_vs_httperf_pct=... (rate_error_pct: the median run's error at each rate, worst rate; the p50
figures: the worst rate's median engine p50 relative to the reference's median). Goals: engine >= 1.5x Locust
and >= 0.3x wrk; rate error < 2%; p50 within 10% of the reference.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apps.capacity.engine import HARD_MAX_RATE, LoadPlan, Target, decode_histogram, run_plan
from tests.netutil import pick_free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
RATES = (100, 1000, 5000)
USERS = 50
TARGET_CPU = 0
CLIENT_CPU = 1

HAPROXY_CFG = """global
    nbthread 1
    maxconn 4000

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 30s

frontend bench
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string ok
"""

WRK_PACED_LUA = """
local delay_ms = tonumber(os.getenv("WRK_DELAY_MS"))
function delay()
  return delay_ms
end
"""

LOCUSTFILE = """
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser


class Bench(FastHttpUser):
    wait_time = constant(0)

    @task
    def get(self):
        self.client.get("/")
"""


def pinned(cpu: int, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpu), *cmd] if shutil.which("taskset") else cmd


def start_haproxy(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = pick_free_port()
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(port=port))
    proc = subprocess.Popen(
        pinned(TARGET_CPU, [HAPROXY, "-db", "-f", str(cfg)]),
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "haproxy.log").open("wb"),
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {(workdir / 'haproxy.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError("haproxy did not start listening")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def run_tool(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        pinned(CLIENT_CPU, cmd), capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout + out.stderr


def wrk_ms(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    if not m:
        raise ValueError(value)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    return float(m.group(1)) * scale


# --- measurements -----------------------------------------------------------------------------------


def engine_open(port: int, rate: int, seconds: float) -> dict[str, float]:
    result = run_plan(LoadPlan.constant(Target("127.0.0.1", port), rate, seconds))
    step = result.steps[0]
    hist = decode_histogram(step.histogram)
    return {
        "achieved": step.achieved_rate,
        "error_pct": abs(step.achieved_rate - rate) / rate * 100.0,
        "p50_ms": step.p50_ms,
        "p99_ms": step.p99_ms,
        "mean_ms": hist.get_mean_value() / 1000.0,
        "errors": step.error_count,
        "conns": result.connections_opened,
    }


def httperf(port: int, rate: int, seconds: float) -> dict[str, float]:
    out = run_tool(
        [
            "httperf", "--hog", "--server", "127.0.0.1", "--port", str(port), "--uri", "/",
            "--rate", str(rate), "--num-conns", str(int(rate * seconds)), "--num-calls", "1",
            "--timeout", "5",
        ],
        timeout_s=seconds * 3 + 30,
    )
    reply = re.search(r"Reply time \[ms\]: response ([\d.]+)", out)
    conn = re.search(r"Connection time \[ms\]: min [\d.]+ avg [\d.]+ max [\d.]+ median ([\d.]+)", out)
    req_rate = re.search(r"Request rate: ([\d.]+) req/s", out)
    errors = re.search(r"Errors: total (\d+)", out)
    if not (reply and conn and req_rate and errors):
        raise RuntimeError(f"could not parse httperf output:\n{out}")
    return {
        "reply_mean_ms": float(reply.group(1)),
        "conn_median_ms": float(conn.group(1)),
        "rate": float(req_rate.group(1)),
        "errors": int(errors.group(1)),
    }


def wrk_paced(port: int, rate: int, seconds: float, workdir: Path) -> dict[str, float]:
    script = workdir / "paced.lua"
    script.write_text(WRK_PACED_LUA)
    conns = max(rate // 100, 1)
    env = {**os.environ, "WRK_DELAY_MS": "10"}
    out = run_tool(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}/"],
        timeout_s=seconds + 30,
        env=env,
    )
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not (p50 and rps):
        raise RuntimeError(f"could not parse wrk output:\n{out}")
    return {"p50_ms": wrk_ms(p50.group(1)), "rate": float(rps.group(1))}


def engine_max(port: int, seconds: float) -> float:
    plan = LoadPlan.closed_loop(
        Target("127.0.0.1", port), [(USERS, seconds)], max_rate=HARD_MAX_RATE, max_connections=USERS
    )
    step = run_plan(plan).steps[0]
    if step.error_count:
        raise RuntimeError(f"engine saw errors at full speed: {step.errors}")
    return step.achieved_rate


def wrk_max(port: int, seconds: float) -> float:
    out = run_tool(["wrk", "-t1", f"-c{USERS}", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/"],
                   timeout_s=seconds + 30)
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"could not parse wrk output:\n{out}")
    return float(m.group(1))


def locust_max(port: int, seconds: float, workdir: Path) -> float:
    locustfile = workdir / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    prefix = workdir / "locust"
    locust = str(Path(sys.executable).with_name("locust"))
    run_tool(
        [locust, "-f", str(locustfile), "--headless", "-u", str(USERS), "-r", str(USERS),
         "-t", f"{seconds:g}s", "--host", f"http://127.0.0.1:{port}", "--csv", str(prefix),
         "--only-summary", "--loglevel", "WARNING"],
        timeout_s=seconds + 60,
    )
    with open(f"{prefix}_stats.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["Name"] == "Aggregated":
                if int(row["Failure Count"]):
                    raise RuntimeError(f"locust saw failures: {row}")
                return float(row["Requests/s"])
    raise RuntimeError("no Aggregated row in locust stats")


def pct(a: float, b: float) -> float:
    return (a / b - 1.0) * 100.0 if b else 0.0


def accuracy(port: int, seconds: float, rounds: int, workdir: Path) -> tuple[float, float, float]:
    """Print the accuracy table; return (worst rate error %, worst p50 vs wrk %, worst vs httperf %)."""
    print(f"\n== accuracy: open loop, {seconds:g} s per run, engine and paced wrk interleaved x{rounds} ==")
    print(
        f"{'rate':>6} {'achieved':>9} {'err%':>6} {'p50 ms':>7} {'p99 ms':>8} {'conns':>5} | "
        f"{'wrk p50':>7} {'wrk rate':>8}"
    )
    rows: list[tuple[int, float, float, dict[str, float]]] = []
    error_pcts: list[float] = []
    for rate in RATES:
        engine_p50s: list[float] = []
        wrk_p50s: list[float] = []
        rate_errors: list[float] = []
        for _ in range(rounds):
            eng = engine_open(port, rate, seconds)
            wp = wrk_paced(port, rate, seconds, workdir)
            rate_errors.append(eng["error_pct"])
            engine_p50s.append(eng["p50_ms"])
            wrk_p50s.append(wp["p50_ms"])
            print(
                f"{rate:>6} {eng['achieved']:>9.1f} {eng['error_pct']:>6.2f} {eng['p50_ms']:>7.3f} "
                f"{eng['p99_ms']:>8.3f} {eng['conns']:>5.0f} | {wp['p50_ms']:>7.3f} {wp['rate']:>8.1f}",
                flush=True,
            )
        hp = httperf(port, rate, seconds)
        error_pcts.append(statistics.median(rate_errors))
        rows.append((rate, statistics.median(engine_p50s), statistics.median(wrk_p50s), hp))

    print("\nmedians per rate; httperf: new connection per request, mean reply time (0.1 ms steps)")
    print(
        f"{'rate':>6} {'err%':>6} {'p50 ms':>7} {'wrk p50':>7} {'vs wrk':>7} | "
        f"{'httperf':>7} {'vs httperf':>10} {'rate':>7}"
    )
    vs_wrk: list[float] = []
    vs_httperf: list[float] = []
    for (rate, engine_p50, wrk_p50, hp), error_pct in zip(rows, error_pcts, strict=True):
        vs_wrk.append(pct(engine_p50, wrk_p50))
        vs_httperf.append(pct(engine_p50, hp["reply_mean_ms"]))
        print(
            f"{rate:>6} {error_pct:>6.2f} {engine_p50:>7.3f} {wrk_p50:>7.3f} {vs_wrk[-1]:>+6.0f}% | "
            f"{hp['reply_mean_ms']:>7.1f} {vs_httperf[-1]:>+9.0f}% {hp['rate']:>7.1f}"
        )
    return max(error_pcts), max(vs_wrk, key=abs), max(vs_httperf, key=abs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per accuracy run")
    parser.add_argument("--rounds", type=int, default=3, help="accuracy runs per rate and tool")
    parser.add_argument("--throughput-seconds", type=float, default=5.0)
    parser.add_argument("--throughput-rounds", type=int, default=2, help="engine and wrk, best kept")
    parser.add_argument("--locust-seconds", type=float, default=10.0)
    args = parser.parse_args()

    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {CLIENT_CPU})
    workdir = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    proc, port = start_haproxy(workdir)
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"haproxy pid {proc.pid} on 127.0.0.1:{port} (cpu {TARGET_CPU}); clients on cpu {CLIENT_CPU}")
        print(f"load average before start: {load} (the machine is shared: latency figures are noisy)")
        rate_error_pct, p50_vs_wrk, p50_vs_httperf = accuracy(port, args.seconds, args.rounds, workdir)

        print(f"\n== throughput on one core ({USERS} connections/users), best of {args.throughput_rounds} ==")
        engine_runs: list[float] = []
        wrk_runs: list[float] = []
        for _ in range(args.throughput_rounds):
            engine_runs.append(engine_max(port, args.throughput_seconds))
            wrk_runs.append(wrk_max(port, args.throughput_seconds))
        engine_rps, wrk_rps = max(engine_runs), max(wrk_runs)
        locust_rps = locust_max(port, args.locust_seconds, workdir)
        runs = " ".join(f"{x:.0f}" for x in engine_runs)
        print(f"{'engine closed loop':<22} {engine_rps:>8.0f} req/s  (runs: {runs})")
        runs = " ".join(f"{x:.0f}" for x in wrk_runs)
        print(f"{'wrk -t1 -c50':<22} {wrk_rps:>8.0f} req/s  (runs: {runs}; engine = {engine_rps / wrk_rps:.2f}x)")
        print(f"{'locust FastHttpUser':<22} {locust_rps:>8.0f} req/s  (engine = {engine_rps / locust_rps:.2f}x)")
        print(
            f"RESULT engine_rps={engine_rps:.0f} wrk_rps={wrk_rps:.0f} locust_rps={locust_rps:.0f} "
            f"rate_error_pct={rate_error_pct:.2f} p50_vs_wrk_pct={p50_vs_wrk:+.1f} "
            f"p50_vs_httperf_pct={p50_vs_httperf:+.1f}"
        )
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
