"""Write deploy/k8s/overlays/monitoring/prometheusrule.yaml from alerts.yml, the one home of the rules.

`python deploy/monitoring/prometheusrule.py` after editing alerts.yml; tests/test_deploy_manifests.py fails
while the PrometheusRule differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
TARGET = HERE.parent / "k8s" / "overlays" / "monitoring" / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/monitoring/alerts.yml by `python deploy/monitoring/prometheusrule.py`: edit the\n"
          "# rules there. The label below is what kube-prometheus-stack's default ruleSelector picks up; set it\n"
          "# to your Prometheus' ruleSelector (kubectl get prometheus -A -o yaml | grep -A3 ruleSelector).\n")


def render() -> str:
    rules = yaml.safe_load(ALERTS.read_text())
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "nitro", "labels": {"app.kubernetes.io/part-of": "nitro",
                                                    "release": "kube-prometheus-stack"}},
           "spec": {"groups": rules["groups"]}}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(Path.cwd()) if TARGET.is_relative_to(Path.cwd()) else TARGET}", file=sys.stderr)
