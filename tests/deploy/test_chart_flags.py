"""Every command line the chart renders parses with the real `ssd` parsers: no flag the services lack."""
from __future__ import annotations


import pytest

from services.draft.service import DraftConfig
from services.router.service import RouterConfig
from services.target.service import TargetConfig
from ssd.cli import build_parser
from ssd.service_config import load_config
from tests.deploy.render import CASES, pod_spec, render_docs

CONFIGS = {"router": RouterConfig, "target": TargetConfig, "draft": DraftConfig}
# Router flags that land with the Redis request journal and API-key issues; checked like every other flag once
# RouterConfig has the field, allowed until then so this test does not depend on the order the work lands in.


def ssd_commands(docs) -> list[tuple[str, list[str]]]:
    out = []
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = pod_spec(doc)
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["image"].split(":")[0].endswith("ssd"):
                out.append((f"{doc['metadata']['name']}/{container['name']}", container["args"]))
    return out


def known_args(role: str, args: list[str]) -> list[str]:
    return list(args)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_args_parse_as_ssd_commands(chart, case, capsys):
    commands = ssd_commands(render_docs(chart, CASES[case]))
    roles = set()
    for where, args in commands:
        role, rest = args[0], args[1:]
        try:
            if role in CONFIGS:
                cfg = load_config(CONFIGS[role], known_args(role, rest), role, env={})
                roles.add(role)
                for arg in rest:
                    name = arg[2:].split("=", 1)[0].replace("-", "_")
                    assert hasattr(cfg, name), f"{where}: {arg}"
            else:
                ns = build_parser().parse_args(args)
                assert ns.command == "models" and ns.models_command in ("prepare", "download"), where
        except SystemExit:
            pytest.fail(f"{where}: `ssd {' '.join(args)}` does not parse: {capsys.readouterr().err}")
    assert {"router", "target"} <= roles


def test_flags_carry_the_values(chart):
    docs = render_docs(chart, {"target": {"tensorParallelSize": 4, "maxSeqs": 7, "threads": 2},
                               "draft": {"k": 5, "budget": 9},
                               "router": {"maxBatch": 3, "mode": "sd", "terminationGracePeriodSeconds": 40,
                                          "preStopSleepSeconds": 5}})
    parsed = {args[0]: load_config(CONFIGS[args[0]], known_args(args[0], args[1:]), args[0], env={})
              for _, args in ssd_commands(docs)}
    assert (parsed["target"].tp_size, parsed["target"].max_seqs, parsed["target"].threads) == (4, 7, 2)
    assert (parsed["draft"].k, parsed["draft"].budget) == (5, 9)
    assert (parsed["router"].max_batch, parsed["router"].mode, parsed["router"].discovery) == (3, "sd", "kubernetes")
    assert parsed["router"].drain_timeout == 30  # the grace period less the preStop sleep and a 5 s margin
    assert parsed["target"].data_address == "tcp://0.0.0.0:5601" and parsed["target"].control_address == "0.0.0.0:5701"
