#!/usr/bin/env python3
"""The cluster scale harness (run through bench/cluster_scale.sh).

A 3-member etcd and N `sluice server` workers on this machine; J snapshot jobs of S splits each
from the `generate` source into the `blackhole` target. It measures, in this order:

  idle      etcd requests per second with N idle workers and no job (etcd's own counters:
            gRPC calls started, every member, the gateway's calls included), per worker, and
            by method
  jobs      submit -> every job planned, submit -> every job succeeded, every job's rows
            counted once (the blackhole's count equals the rows declared), etcd's requests
            during the run, the database size after, workers' memory and CPU while busy, the
            leader's planning time per job and each plan's size in etcd (from the leader's log
            line), claims per worker (fairness: every worker has the same capacity and
            weight), claims beyond the tasks planned and lease renewals that failed (a node that
            lost its lease under load: a false failover)
  failover  K kills: a worker running tasks of a long job is SIGKILLed; the time from the kill
            until every task it held is owned by another worker (GET /api/v1/jobs/NAME)

It prints a JSON report and writes it to --report.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, content_type="application/yaml", timeout=30):
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for(what, condition, timeout, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(every)


class Etcd:
    def __init__(self, base, members):
        self.clients = [free_port() for _ in range(members)]
        peers = [free_port() for _ in range(members)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(peers))
        self.processes = []
        for i in range(members):
            log = open(os.path.join(base, f"etcd{i}.log"), "w")
            self.processes.append(subprocess.Popen(
                ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(base, f"etcd{i}"),
                 "--listen-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                 "--advertise-client-urls", f"http://127.0.0.1:{self.clients[i]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peers[i]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[i]}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", "sluice-scale"],
                stdout=subprocess.DEVNULL, stderr=log))
        self.endpoints = ",".join(f"http://127.0.0.1:{p}" for p in self.clients)
        wait_for("etcd", lambda: all(self.metrics_text(i) for i in range(members)), 30)

    def metrics_text(self, member):
        try:
            return http("GET", f"http://127.0.0.1:{self.clients[member]}/metrics", timeout=5)[1]
        except OSError:
            return ""

    def counters(self):
        """gRPC calls started, by method, summed over the members; and the db size."""
        calls, size = {}, 0
        for member in range(len(self.clients)):
            for line in self.metrics_text(member).splitlines():
                match = re.match(r'grpc_server_started_total\{[^}]*grpc_method="(\w+)"[^}]*\} (\S+)', line)
                if match:
                    calls[match.group(1)] = calls.get(match.group(1), 0) + float(match.group(2))
                match = re.match(r"etcd_mvcc_db_total_size_in_bytes (\S+)", line)
                if match:
                    size = max(size, float(match.group(1)))
        return calls, size

    def stop(self):
        for process in self.processes:
            process.kill()
            process.wait()


class Worker:
    def __init__(self, sluice, base, index, etcd, capacity, lease):
        self.id = f"w{index}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self.log = os.path.join(base, f"{self.id}.log")
        self.arguments = [sluice, "server", "--listen", f"127.0.0.1:{self.port}", "--node-id", self.id,
                          "--state-dir", os.path.join(base, f"state-{self.id}"), "--etcd", etcd,
                          "--capacity", str(capacity), "--lease-secs", str(lease)]
        self.start()

    def start(self):
        self.process = subprocess.Popen(self.arguments, stdout=subprocess.DEVNULL, stderr=open(self.log, "a"),
                                        env={**os.environ, "RUST_LOG": "warn"})

    def ready(self):
        try:
            return http("GET", f"{self.url}/workers", timeout=2)[0] == 200
        except OSError:
            return False

    def rss_kib(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            return int(re.search(r"VmRSS:\s+(\d+)", status.read()).group(1))

    def cpu_seconds(self):
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self):
        self.process.kill()
        self.process.wait()


def job_text(name, seed, rows, split_rows, rate=None):
    table = f"{{name: t, rows: {rows}, columns: {{id: bigint, v: text}}}}"
    limits = f"{{split_rows: {split_rows}" + (f", rows_per_sec: {rate}" if rate else "") + "}"
    return (f"name: {name}\nmode: snapshot\n"
            f"source: {{type: generate, seed: {seed}, tables: [{table}]}}\n"
            f"target: {{type: blackhole}}\nlimits: {limits}\n")


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(len(values) * q + 0.999999) - 1))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sluice", required=True)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--split-rows", type=int, default=1000)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--lease", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--kills", type=int, default=0)
    parser.add_argument("--report", required=True)
    arguments = parser.parse_args()

    base = tempfile.mkdtemp(prefix="sluice-cluster-scale.", dir="/dev/shm")
    report = {"workers": arguments.workers, "jobs": arguments.jobs, "splits_per_job": arguments.splits,
              "split_rows": arguments.split_rows, "capacity": arguments.capacity, "lease_secs": arguments.lease}
    etcd = Etcd(base, 3)
    workers = []
    try:
        for index in range(arguments.workers):
            workers.append(Worker(arguments.sluice, base, index, etcd.endpoints, arguments.capacity, arguments.lease))
        wait_for("every worker's API", lambda: all(worker.ready() for worker in workers), 120, 0.5)
        api = workers[0].url
        wait_for("every worker registered",
                 lambda: len(json.loads(http("GET", f"{api}/workers")[1])) == arguments.workers, 60, 0.5)

        # Idle: nothing to do but stay alive.
        time.sleep(2)
        before, _ = etcd.counters()
        cpu_before = [worker.cpu_seconds() for worker in workers]
        started = time.monotonic()
        time.sleep(arguments.idle_seconds)
        after, size = etcd.counters()
        elapsed = time.monotonic() - started
        cpu_after = [worker.cpu_seconds() for worker in workers]
        by_method = {method: round((after.get(method, 0) - before.get(method, 0)) / elapsed, 3)
                     for method in after if after.get(method, 0) != before.get(method, 0)}
        total = sum(by_method.values())
        report["idle"] = {
            "seconds": round(elapsed, 1),
            "etcd_requests_per_second": round(total, 2),
            "per_worker": round(total / arguments.workers, 3),
            "by_method": by_method,
            "worker_rss_kib_max": max(worker.rss_kib() for worker in workers),
            "worker_cpu_percent_mean": round(100 * sum(a - b for a, b in zip(cpu_after, cpu_before))
                                             / arguments.workers / elapsed, 2),
            "etcd_db_bytes": size,
        }
        print(json.dumps({"idle": report["idle"]}), flush=True)

        # Jobs: J snapshot jobs of S splits each.
        rows = arguments.splits * arguments.split_rows
        before, _ = etcd.counters()
        cpu_before = [worker.cpu_seconds() for worker in workers]
        submitted = time.monotonic()
        for index in range(arguments.jobs):
            status, body = http("POST", f"{api}/jobs", job_text(f"g{index}", index + 1, rows, arguments.split_rows))
            if status != 201:
                sys.exit(f"job g{index} was refused: {status} {body}")
        submit_seconds = time.monotonic() - submitted
        planned_at = finished_at = None
        states = {}
        while finished_at is None:
            status, body = http("GET", f"{api}/jobs", timeout=60)
            jobs = json.loads(body) if status == 200 else []
            states = {}
            for job in jobs:
                states[job.get("state")] = states.get(job.get("state"), 0) + 1
            if planned_at is None and len(jobs) == arguments.jobs and all(job.get("state") not in ("pending", "scheduled") for job in jobs):
                planned_at = time.monotonic()
            if len(jobs) == arguments.jobs and all(job.get("state") in ("succeeded", "failed") for job in jobs):
                finished_at = time.monotonic()
                final = jobs
            if time.monotonic() - submitted > 3600:
                sys.exit(f"the jobs did not finish within an hour: {states}")
            time.sleep(0.5)
        after, size = etcd.counters()
        cpu_after = [worker.cpu_seconds() for worker in workers]
        busy = [100 * (a - b) / (finished_at - submitted) for a, b in zip(cpu_after, cpu_before)]
        logs = {}
        for worker in workers:
            with open(worker.log, errors="replace") as log:
                logs[worker.id] = log.read()
        plans = [(int(tasks), int(size_bytes), int(ms)) for text in logs.values() for tasks, size_bytes, ms in
                 re.findall(r"planned generation \d+ into (\d+) tasks \(\d+ plan pieces, (\d+) bytes\) in (\d+) ms", text)]
        claims = {worker: len(re.findall(r"claimed task ", text)) for worker, text in logs.items()}
        renewals_failed = sum(len(re.findall(r"cannot renew its lease", text)) for text in logs.values())
        wrong = [job["name"] for job in final
                 if job.get("state") != "succeeded" or (job.get("stats") or {}).get("rows_written") != rows]
        report["jobs_run"] = {
            "submit_seconds": round(submit_seconds, 2),
            "submit_to_planned_seconds": round(planned_at - submitted, 2),
            "submit_to_finished_seconds": round(finished_at - submitted, 2),
            "rows_per_job": rows,
            "jobs_not_exactly_once": wrong[:20],
            "jobs_not_exactly_once_count": len(wrong),
            "first_job_not_exactly_once": next((job for job in final if job["name"] in wrong), None),
            "etcd_requests": int(sum(after.values()) - sum(before.values())),
            "etcd_db_bytes": size,
            "worker_rss_kib_max": max(worker.rss_kib() for worker in workers),
            "worker_busy_cpu_percent_mean": round(sum(busy) / len(busy), 2),
            "worker_busy_cpu_percent_max": round(max(busy), 2),
            "plans_logged": len(plans),
            "tasks_planned": sum(tasks for tasks, _, _ in plans),
            "planning_ms_p50": quantile([ms for _, _, ms in plans], 0.5) if plans else None,
            "planning_ms_p99": quantile([ms for _, _, ms in plans], 0.99) if plans else None,
            "planning_ms_max": max((ms for _, _, ms in plans), default=None),
            "plan_bytes_mean": round(sum(size for _, size, _ in plans) / len(plans)) if plans else None,
            "plan_bytes_max": max((size for _, size, _ in plans), default=None),
            "claims": sum(claims.values()),
            "claims_per_worker_min": min(claims.values()),
            "claims_per_worker_mean": round(sum(claims.values()) / len(claims), 1),
            "claims_per_worker_max": max(claims.values()),
            "lease_renewals_failed": renewals_failed,
        }
        print(json.dumps({"jobs_run": report["jobs_run"]}), flush=True)

        # Failover: kill a worker that holds tasks of a slow job; time until others own them.
        times = []
        if arguments.kills:
            # At most 16 groups of splits a table, each at `split_rows` rows a second: 200 s each.
            slow_rows = arguments.split_rows * 16 * 200
            status, body = http("POST", f"{api}/jobs",
                                job_text("slow", 7, slow_rows, arguments.split_rows, rate=arguments.split_rows))
            assert status == 201, body
        for kill in range(arguments.kills):
            live = [worker for worker in workers if worker.process.poll() is None and worker.ready()]
            api = live[0].url

            def holders():
                try:
                    status, body = http("GET", f"{api}/jobs/slow")
                except OSError:
                    return {}
                tasks = json.loads(body).get("tasks", []) if status == 200 else []
                return {task["id"]: task.get("worker") for task in tasks if task.get("state") == "running"}

            def held_by_others():
                owners = holders()
                held = {worker.id: [task for task, owner in owners.items() if owner == worker.id]
                        for worker in live[1:]}
                return held if any(held.values()) else None

            held = wait_for("running tasks of the slow job on a worker other than the first", held_by_others, 60)
            victim_id, tasks = max(held.items(), key=lambda item: len(item[1]))
            victim = next(worker for worker in workers if worker.id == victim_id)
            killed = time.monotonic()
            victim.kill()

            def moved():
                owners = holders()
                return all(owners.get(task) not in (None, victim_id) for task in tasks)

            wait_for(f"the tasks of {victim_id} to move", moved, 60, 0.02)
            times.append(time.monotonic() - killed)
            print(f"kill {kill + 1}: {len(tasks)} tasks of {victim_id} moved in {times[-1]:.2f} s", flush=True)
            victim.start()
        if times:
            report["failover"] = {"kills": len(times), "p50": round(quantile(times, 0.5), 2),
                                  "p99": round(quantile(times, 0.99), 2), "max": round(max(times), 2),
                                  "seconds": [round(t, 2) for t in times]}
            print(json.dumps({"failover": report["failover"]}), flush=True)
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGKILL)
                worker.process.wait()
        etcd.stop()
        if os.environ.get("SLUICE_SCALE_KEEP"):
            print(f"kept {base}", flush=True)
        else:
            subprocess.run(["rm", "-rf", base])
    with open(arguments.report, "w") as out:
        json.dump(report, out, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
