"""Audit of the pod-to-pod flows a test run made against the NetworkPolicies.

The test cluster's bridge CNI enforces no NetworkPolicy, so the checks watch conntrack instead:
every TCP connection seen between two pods (after Service DNAT: the reply's source is the pod
that answered) is judged by the ingress rules of the policies that select its destination.
Flows from the node itself (kubelet, the checks' own client) are listed apart: what a CNI lets
through from the node is its own choice.
"""

from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass

from cluster_api import kubectl_json

BRIDGE_IP = "10.88.0.1"
TUPLE = re.compile(r"src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)")


@dataclass(frozen=True)
class Flow:
    source: str       # pod name, or "node"
    destination: str  # pod name
    port: int


class FlowWatch:
    """Polls conntrack and the pod list every second while the checks run."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}  # ip -> pod (the last pod seen with it)
        self.seen: set[tuple[str, str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> FlowWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except (subprocess.SubprocessError, RuntimeError, ValueError):
                pass
            self._stop.wait(1)

    def _poll(self) -> None:
        for pod in kubectl_json("get", "pods")["items"]:
            ip = pod["status"].get("podIP")
            if ip:
                self.pods[ip] = pod
        table = subprocess.run(["conntrack", "-L", "-p", "tcp"], capture_output=True, text=True)
        for line in table.stdout.splitlines():
            tuples = TUPLE.findall(line)
            if len(tuples) == 2:
                (src, _, _, _), (answerer, _, sport, _) = tuples
                self.seen.add((src, answerer, int(sport)))

    def flows(self) -> list[Flow]:
        out = set()
        for src, dst, port in self.seen:
            if dst not in self.pods:
                continue  # not to a pod of the namespace (the API server, DNS on the node)
            source = "node" if src == BRIDGE_IP else self.pods.get(src, {}).get("metadata", {}).get("name")
            if source:
                out.add(Flow(source, self.pods[dst]["metadata"]["name"], port))
        return sorted(out, key=lambda f: (f.destination, f.source, f.port))

    def labels(self, name: str) -> dict:
        for pod in self.pods.values():
            if pod["metadata"]["name"] == name:
                return pod["metadata"].get("labels", {})
        return {}

    def container_ports(self, name: str) -> dict[str, int]:
        for pod in self.pods.values():
            if pod["metadata"]["name"] == name:
                return {p["name"]: p["containerPort"] for c in pod["spec"]["containers"]
                        for p in c.get("ports", []) if "name" in p}
        return {}


def selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, op = labels.get(expression["key"]), expression["operator"]
        values = expression.get("values", [])
        if (op == "In" and value not in values) or (op == "NotIn" and value in values) \
                or (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def allowed(flow: Flow, policies: list[dict], watch: FlowWatch) -> str | None:
    """The policy that admits ``flow`` ("no policy" when none selects its pod), or None."""
    labels = watch.labels(flow.destination)
    selecting = [p for p in policies if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and selects(p["spec"].get("podSelector", {}), labels)]
    if not selecting:
        return "no policy"
    source = watch.labels(flow.source)
    ports = watch.container_ports(flow.destination)
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            if _admits(rule, flow, source, ports):
                return policy["metadata"]["name"]
    return None


def _admits(rule: dict, flow: Flow, source: dict, ports: dict[str, int]) -> bool:
    port_ok = not rule.get("ports") or any(
        ports.get(p["port"], p["port"]) == flow.port for p in rule["ports"])
    peers = rule.get("from")
    # Peers are pods of this namespace (podSelector alone) or of labelled namespaces.
    peer_ok = not peers or (flow.source != "node" and any(
        "podSelector" in peer and "namespaceSelector" not in peer
        and selects(peer["podSelector"], source) for peer in peers))
    return port_ok and peer_ok


def audit(watch: FlowWatch) -> tuple[list[tuple[Flow, str]], list[Flow], list[Flow]]:
    """(allowed pod-to-pod flows with the admitting policy, denied ones, flows from the node)."""
    policies = kubectl_json("get", "networkpolicies")["items"]
    ok, denied, node = [], [], []
    for flow in watch.flows():
        if flow.source == "node":
            node.append(flow)
            continue
        policy = allowed(flow, policies, watch)
        (ok.append((flow, policy)) if policy else denied.append(flow))
    return ok, denied, node
