"""The test cluster as the checks see it: kubectl, pods, their processes on the node, the
gateway Service, and streams through it that resume like a client should."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from dataclasses import dataclass, field

import httpx

NAMESPACE = "cascade"
CACHE = os.environ.get("CASCADE_K8S_CACHE", "/var/cache/cascade-k8s")
RUN = os.environ.get("CASCADE_K8S_RUN", "/var/lib/cascade-k8s")


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> str:
    result = subprocess.run([f"{CACHE}/bin/kubectl", "-n", NAMESPACE, *args], capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def kubectl_json(*args: str) -> dict:
    return json.loads(kubectl(*args, "-o", "json"))


def pods(component: str | None = None, running: bool = True) -> list[dict]:
    selector = "app.kubernetes.io/name=cascade"
    if component:
        selector += f",app.kubernetes.io/component={component}"
    items = kubectl_json("get", "pods", "-l", selector)["items"]
    if running:
        items = [p for p in items if p["status"].get("phase") == "Running"
                 and not p["metadata"].get("deletionTimestamp")]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


def container_pid(pod_name: str, container: str) -> int:
    """The host pid of a pod's container's main process (containerd's task)."""
    ctr = ["ctr", "-a", f"{RUN}/containerd.sock", "-n", "k8s.io"]
    for cid in subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True,
                              check=True).stdout.split():
        info = subprocess.run([*ctr, "containers", "info", cid], capture_output=True, text=True)
        if info.returncode:
            continue
        labels = json.loads(info.stdout).get("Labels", {})
        if (labels.get("io.kubernetes.pod.name") == pod_name
                and labels.get("io.kubernetes.container.name") == container):
            tasks = subprocess.run([*ctr, "tasks", "ls"], capture_output=True, text=True).stdout
            for line in tasks.splitlines()[1:]:
                task, pid, status = line.split()[:3]
                if task == cid and status == "RUNNING":
                    return int(pid)
    raise RuntimeError(f"no running container {container} in pod {pod_name}")


def metric(ip: str, name: str, port: int = 9090) -> float:
    """The sum of a metric's samples on a pod's /metrics (0 when absent)."""
    text = httpx.get(f"http://{ip}:{port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@dataclass
class Gateway:
    """The gateway Service (its ClusterIP: kube-proxy routes it from the node too)."""

    base: str
    key: str
    model: str = ""

    @classmethod
    def find(cls) -> Gateway:
        ip = kubectl_json("get", "service", "gateway")["spec"]["clusterIP"]
        secret = kubectl_json("get", "secret", "cascade-api-keys")["data"]["CASCADE_API_KEYS"]
        key = base64.b64decode(secret).decode().split(",")[0].strip()
        gateway = cls(f"http://{ip}:8000", key)
        models = httpx.get(f"{gateway.base}/v1/models", headers=gateway.auth, timeout=30)
        models.raise_for_status()
        gateway.model = models.json()["data"][0]["id"]
        return gateway

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}

    def body(self, prompt: str, max_tokens: int, stream: bool) -> dict:
        """A greedy chat request drafted by the model drafter: the speculation memory would
        replay a repeated request in a few large rounds, leaving no time for a fault."""
        return {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                "draft_method": "model"}

    def complete(self, prompt: str, max_tokens: int) -> str:
        reply = httpx.post(f"{self.base}/v1/chat/completions", headers=self.auth, timeout=300,
                           json=self.body(prompt, max_tokens, stream=False))
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]["content"]


@dataclass
class Stream:
    """A streamed completion that resumes after its last event when its connection breaks
    (``GET /v1/sessions/{id}/events`` with ``Last-Event-ID``), as a client should."""

    gateway: Gateway
    prompt: str
    max_tokens: int
    text: str = ""
    last_id: str | None = None
    events: int = 0
    resumes: int = 0
    faulted_at: int | None = None
    """The event after which the fault was done (None: not done)."""
    errors: list[str] = field(default_factory=list)

    def run(self, fault=None, after_events: int = 3, deadline_s: float = 400) -> str:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                if self._read(fault, after_events):
                    return self.text
            except httpx.HTTPError as error:
                self.errors.append(f"{type(error).__name__}: {error}"[:200])
            self.resumes += 1
            time.sleep(1)
        raise TimeoutError(f"stream unfinished after {deadline_s:.0f}s: {self.errors[-3:]}")

    def _request(self, client: httpx.Client):
        if self.last_id is None:
            return client.stream("POST", f"{self.gateway.base}/v1/chat/completions",
                                 json=self.gateway.body(self.prompt, self.max_tokens, True))
        session = self.last_id.rsplit(".", 1)[0]
        return client.stream("GET", f"{self.gateway.base}/v1/sessions/{session}/events",
                             headers={"Last-Event-ID": self.last_id})

    def _read(self, fault, after_events: int) -> bool:
        """One connection's events; True when the stream ended with [DONE]."""
        with httpx.Client(headers=self.gateway.auth, timeout=httpx.Timeout(60, connect=5)) as client:
            with self._request(client) as response:
                if response.status_code != 200:
                    response.read()
                    self.errors.append(f"HTTP {response.status_code}: {response.text[:160]}")
                    return False
                event: dict[str, str] = {}
                for line in response.iter_lines():
                    if line:
                        name, _, value = line.partition(":")
                        event[name] = value.strip()
                        continue
                    if event.get("data") == "[DONE]":
                        return True
                    if "data" in event:
                        self._take(event)
                        if fault and self.faulted_at is None and self.events >= after_events:
                            self.faulted_at = self.events
                            fault()
                    event = {}
        return False

    def _take(self, event: dict[str, str]) -> None:
        chunk = json.loads(event["data"])
        if "error" in chunk:
            raise httpx.HTTPError(f"error event: {chunk['error']}")
        self.text += "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices", []))
        self.last_id = event.get("id", self.last_id)
        self.events += 1
