"""``cascade bench <name>``: every benchmark as a subcommand (see cascade.bench), its command
line generated from its settings class (``cascade.serving.settings_cli``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from cascade.bench.compare import run as compare
from cascade.bench.drafting import cascades, memory, ngram_copy, structured, suffix_lookup
from cascade.bench.load import admission, grpc_floor, prefix_chat, rtt, shared_prefill
from cascade.bench.load import settings as load
from cascade.bench.reliability import chaos, faults, redis_durability
from cascade.bench.step import engine, gpu, plan_cost, tensor_parallel, tree_cost
from cascade.distill.measure import invariance, replay, tree_drafter_kv, tree_eval
from cascade.serving.settings_cli import command_line, settings_function

BENCHES: tuple[tuple[str, type[BaseModel], Callable[[Any], object]], ...] = (
    ("compare", compare.CompareSettings, compare.run),
    ("load", load.LoadSettings, load.run),
    ("engine", engine.EngineSettings, engine.run),
    ("admission", admission.AdmissionSettings, admission.run),
    ("cascades", cascades.CascadesSettings, cascades.run),
    ("chaos", chaos.ChaosSettings, chaos.run),
    ("faults", faults.FaultsSettings, faults.run),
    ("gpu", gpu.GpuSettings, gpu.run),
    ("grpc-floor", grpc_floor.GrpcFloorSettings, grpc_floor.run),
    ("invariance", invariance.InvarianceSettings, invariance.run),
    ("memory", memory.MemorySettings, memory.run),
    ("ngram-copy", ngram_copy.NgramCopySettings, ngram_copy.run),
    ("plan-cost", plan_cost.PlanCostSettings, plan_cost.run),
    ("prefix-chat", prefix_chat.PrefixChatSettings, prefix_chat.run),
    ("redis-durability", redis_durability.RedisDurabilitySettings, redis_durability.run),
    ("replay", replay.ReplaySettings, replay.run),
    ("rtt", rtt.RttSettings, rtt.run),
    ("shared-prefill", shared_prefill.SharedPrefillSettings, shared_prefill.run),
    ("structured", structured.StructuredSettings, structured.run),
    ("suffix-lookup", suffix_lookup.SuffixLookupSettings, suffix_lookup.run),
    ("tp", tensor_parallel.TpSettings, tensor_parallel.run),
    ("tree-cost", tree_cost.TreeCostSettings, tree_cost.run),
    ("tree-drafter-kv", tree_drafter_kv.TreeDrafterKvSettings, tree_drafter_kv.run),
    ("tree-eval", tree_eval.TreeEvalSettings, tree_eval.run))
"""Every benchmark: (command, settings class, what runs it)."""

bench_app = command_line(help="Benchmarks: each prints a table of ratios measured side by side "
                         "in one run (docs/benchmarks.md has the commands and latest results).",
                         no_args_is_help=True)
for _name, _settings, _run in BENCHES:
    bench_app.command(_name)(settings_function(_settings, _run))
