"""Cluster DNS stand-in: keep a dnsmasq hosts file in step with Services and Endpoints.

The test cluster has no CoreDNS image. Every 2 s this writes the names CoreDNS would answer:
``<svc>.<ns>.svc.cluster.local`` for a ClusterIP (headless Services: every ready address), and
``<hostname>.<svc>.<ns>.svc.cluster.local`` for pods with a hostname (StatefulSets). dnsmasq
re-reads the file when it changes. Usage: python3 dns_sync.py HOSTS_FILE
"""

import json
import os
import subprocess
import sys
import time

DOMAIN = "svc.cluster.local"


def cluster_objects(kind: str) -> list[dict]:
    out = subprocess.run(["kubectl", "get", kind, "-A", "-o", "json"], capture_output=True,
                         text=True, check=True, env=os.environ).stdout
    return json.loads(out)["items"]


def service_lines(service: dict, endpoints: dict | None) -> list[str]:
    meta = service["metadata"]
    name = f"{meta['name']}.{meta['namespace']}.{DOMAIN}"
    cluster_ip = service["spec"].get("clusterIP")
    if cluster_ip and cluster_ip != "None":
        return [f"{cluster_ip} {name}"]
    lines = []
    for subset in (endpoints or {}).get("subsets") or []:
        for address in subset.get("addresses") or []:
            lines.append(f"{address['ip']} {name}")
            if address.get("hostname"):
                lines.append(f"{address['ip']} {address['hostname']}.{name}")
    return lines


def hosts_text() -> str:
    endpoints = {(e["metadata"]["namespace"], e["metadata"]["name"]): e
                 for e in cluster_objects("endpoints")}
    lines = []
    for service in cluster_objects("services"):
        key = (service["metadata"]["namespace"], service["metadata"]["name"])
        lines.extend(service_lines(service, endpoints.get(key)))
    return "\n".join(sorted(lines)) + "\n"


def main(path: str) -> None:
    kubectl_dir = os.path.join(os.environ.get("CASCADE_K8S_CACHE", "/var/cache/cascade-k8s"), "bin")
    os.environ["PATH"] = f"{kubectl_dir}:{os.environ['PATH']}"
    written = None
    while True:
        try:
            text = hosts_text()
        except (subprocess.CalledProcessError, json.JSONDecodeError) as error:
            print(f"dns-sync: {error}", file=sys.stderr, flush=True)
            text = written
        if text is not None and text != written:
            with open(path + ".new", "w") as f:
                f.write(text)
            os.replace(path + ".new", path)
            written = text
        time.sleep(2)


if __name__ == "__main__":
    main(sys.argv[1])
