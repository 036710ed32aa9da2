"""The checks of scripts/k8s-e2e.sh against the running test cluster (one phase per overlay).

Every fault check runs one long greedy stream through the gateway Service, does something to a
pod mid-stream, and passes only when the stream (resuming as a client should) ends with exactly
the text of the same request without the fault. Results are appended, one row each, to the
results table (markdown). Usage: python checks.py local|redis-ha RESULTS_FILE
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import httpx

from cluster_api import Gateway, Stream, container_pid, kubectl, metric, pods, ready
from flows import FlowWatch, audit

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
PROMPTS = ["Explain how a bicycle works.", "List five uses of a paperclip.",
           "Describe the water cycle.", "What makes a good cup of tea?",
           "Write a haiku about autumn.", "Summarise the plot of Hamlet."]
MAX_TOKENS = 160


class Results:
    def __init__(self, path: str, phase: str) -> None:
        self.path, self.phase, self.failed = path, phase, 0

    def record(self, name: str, ok: bool, detail: str, seconds: float) -> None:
        self.failed += not ok
        row = f"| {self.phase} | {name} | {'PASS' if ok else 'FAIL'} | {seconds:.0f} s | {detail} |"
        print(row, flush=True)
        with open(self.path, "a") as f:
            f.write(row + "\n")

    def check(self, name: str, body: Callable[[], tuple[bool, str]]) -> None:
        started = time.monotonic()
        try:
            ok, detail = body()
        except Exception as error:  # a check that raises fails; the others still run
            ok, detail = False, f"{type(error).__name__}: {error}"[:300]
        self.record(name, ok, detail.replace("|", "/").replace("\n", " "), time.monotonic() - started)


def wait_ready(timeout_s: float = 600) -> None:
    """Every workload rolled out and every pod of the namespace Ready (Jobs: complete)."""
    deadline = time.monotonic() + timeout_s
    for kind in ("deployment", "statefulset"):
        for name in kubectl("get", kind, "-o", "name").split():
            left = max(1, int(deadline - time.monotonic()))
            kubectl("rollout", "status", name, f"--timeout={left}s", timeout=left + 10)
    while time.monotonic() < deadline:
        if all(ready(p) for p in pods()):
            return
        time.sleep(2)
    raise TimeoutError("pods not Ready")


def fault_stream(gateway: Gateway, reference: str, fault: Callable[[], None]) -> tuple[bool, str]:
    stream = Stream(gateway, PROMPT, MAX_TOKENS)
    text = stream.run(fault=fault, after_events=10)
    same = text == reference
    mid_stream = stream.faulted_at is not None and stream.events > stream.faulted_at
    detail = (f"fault after event {stream.faulted_at} of {stream.events}, {stream.resumes} reconnections, "
              f"{'same text as without the fault' if same else 'TEXT DIFFERS'}")
    if not same:
        at = next((i for i, (a, b) in enumerate(zip(text, reference)) if a != b),
                  min(len(text), len(reference)))
        detail += (f" ({len(text)} vs {len(reference)} characters, first difference at {at}: "
                   f"{text[max(0, at - 20):at + 30]!r} vs {reference[max(0, at - 20):at + 30]!r})")
    if stream.errors:
        detail += f"; breaks: {stream.errors[0][:80]}"
    wait_ready()
    return same and mid_stream, detail


def kill_main_process(component: str) -> str:
    pod = pods(component)[0]["metadata"]["name"]
    os.kill(container_pid(pod, component), signal.SIGKILL)
    return pod


def delete_pod(component: str) -> None:
    delete_pod_named(pods(component)[0]["metadata"]["name"])


def one_dtype(gateway: Gateway) -> tuple[bool, str]:
    """Every registered verifier serves one dtype (/v1/models joins several with commas)."""
    dtype = httpx.get(f"{gateway.base}/v1/models", headers=gateway.auth,
                      timeout=30).json()["data"][0].get("dtype", "")
    return "," not in dtype and dtype != "", f"the verifiers serve {dtype or 'no dtype'}"


def basics(results: Results) -> Gateway:
    gateway = Gateway.find()

    def unauthorised():
        reply = httpx.post(f"{gateway.base}/v1/completions", timeout=30,
                           json=gateway.body("Hi", 4, stream=False))
        return reply.status_code == 401, f"HTTP {reply.status_code} without a key"

    def completion_and_stream():
        text = gateway.complete(PROMPTS[0], 32)
        streamed = Stream(gateway, PROMPTS[0], 32).run()
        return (text != "" and streamed == text,
                f"{len(text)} characters; the stream {'equals' if streamed == text else 'DIFFERS FROM'} the completion")

    results.check("401 without an API key", unauthorised)
    results.check("one dtype across the verifiers (/v1/models)", lambda: one_dtype(gateway))
    results.check("a completion and a stream through the gateway Service", completion_and_stream)
    return gateway


def spread(gateway: Gateway) -> tuple[bool, str]:
    kubectl("scale", "deployment/drafter", "--replicas=3")
    wait_ready()
    drafters = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods("drafter")}
    busiest = dict.fromkeys(drafters, 0.0)
    streams = [Stream(gateway, prompt, 96) for prompt in PROMPTS]
    threads = [threading.Thread(target=s.run) for s in streams]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for name, ip in drafters.items():
            busiest[name] = max(busiest[name], metric(ip, "cascade:drafter_active_sessions"))
        time.sleep(0.5)
    finished = sum(s.text != "" for s in streams)
    took = sum(v > 0 for v in busiest.values())
    return (took == len(drafters) and finished == len(streams),
            f"{len(drafters)} drafters; {finished}/{len(streams)} concurrent streams finished; "
            f"most sessions at once per drafter: {sorted(int(v) for v in busiest.values())}")


def redis_primary() -> str:
    """The pod the sentinels name as the primary now."""
    reply = kubectl("exec", "redis-sentinel-0", "-c", "redis-sentinel", "--", "redis-cli", "-p", "26379",
                    "sentinel", "get-master-addr-by-name", "cascade")
    return reply.split()[0].split(".")[0]


def freeze_primary() -> None:
    pod = redis_primary()
    pid = container_pid(pod, "redis")
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(20, os.kill, (pid, signal.SIGCONT)).start()


def failed_over(before: str) -> tuple[bool, str]:
    for _ in range(60):
        now = redis_primary()
        if now != before:
            return True, f"primary {before} -> {now}"
        time.sleep(1)
    return False, f"primary still {before}"


def faults_local(results: Results, gateway: Gateway, reference: str) -> None:
    results.check("a drafter killed (SIGKILL) mid-stream",
                  lambda: fault_stream(gateway, reference, lambda: kill_main_process("drafter")))
    results.check("a verifier drained (pod deleted: preStop, SIGTERM) mid-stream",
                  lambda: fault_stream(gateway, reference, lambda: delete_pod("verifier")))
    results.check("the gateway deleted mid-stream (it drains)",
                  lambda: fault_stream(gateway, reference, lambda: delete_pod("gateway")))
    results.check("the gateway killed (SIGKILL) mid-stream (the client resumes)",
                  lambda: fault_stream(gateway, reference, lambda: kill_main_process("gateway")))
    results.check("drafters scaled 1 -> 3, sessions spread", lambda: spread(gateway))


def faults_redis(results: Results, gateway: Gateway, reference: str) -> None:
    for name, fault in (("deleted", lambda: delete_pod_named(redis_primary())),
                        ("frozen (SIGSTOP 20 s)", freeze_primary)):
        def body(fault=fault):
            before = redis_primary()
            ok, detail = fault_stream(gateway, reference, fault)
            moved, where = failed_over(before)
            return ok and moved, f"{where}; {detail}"
        results.check(f"the Redis primary {name} mid-stream", body)


def delete_pod_named(name: str) -> None:
    kubectl("delete", "pod", name, "--wait=false")


def main(phase: str, path: str) -> int:
    results = Results(path, phase)
    with FlowWatch() as watch:
        results.check("every pod Ready", lambda: (wait_ready() is None, f"{len(pods())} pods Ready"))
        gateway = basics(results)
        reference = Stream(gateway, PROMPT, MAX_TOKENS).run()
        (faults_local if phase == "local" else faults_redis)(results, gateway, reference)
        results.check("one dtype across the verifiers after the faults", lambda: one_dtype(gateway))
    ok, denied, node = audit(watch)
    detail = (f"{len(ok)} pod-to-pod flows, all allowed" if not denied else
              "DENIED: " + ", ".join(f"{f.source}->{f.destination}:{f.port}" for f in denied))
    results.record("observed flows vs NetworkPolicies", not denied,
                   f"{detail}; {len(node)} from the node (probes, the checks)", 0)
    for flow, policy in ok:
        print(f"  flow {flow.source} -> {flow.destination}:{flow.port} allowed by {policy}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
