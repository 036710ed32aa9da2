"""What the goodput plan itself costs the verifier per step, against the rows in the pass.

    cascade bench plan-cost [--repeats 50]

Every row offers a 4-token block with falling survival and a measured round trip, on a linear
CPU-like pass cost; the plan looks at every candidate prefix of the 4 x rows slots.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from cascade.bench.compare.run import machine
from cascade.core.plan.goodput import PlanInputs, RowPlan, plan_pass
from cascade.core.verify.step_cost import StepShape
from cascade.serving.settings_cli import settings_command


class LinearCost:
    def predict(self, shape: StepShape) -> float:
        return (0.03 + 0.002 * shape.num_tokens + 0.0005 * shape.num_rows
                + 1e-6 * shape.num_cached)


def plan_ms(num_rows: int, repeats: int) -> float:
    rows = [RowPlan(4, [0.7, 0.5, 0.35, 0.2], 300 + i, previous=2, wait_s=0.004,
                    draft_token_s=0.003) for i in range(num_rows)]
    inputs, cost = PlanInputs(rows), LinearCost()
    started = time.perf_counter()
    for _ in range(repeats):
        plan_pass(inputs, cost)
    return 1000 * (time.perf_counter() - started) / repeats


class PlanCostSettings(BaseModel):
    """What the goodput plan costs the verifier per step, for 4, 16, 32 and 64 rows in the pass
    (each row offering a 4-token block)."""

    repeats: int = Field(50, ge=1, description="Plans timed per row count (the mean is "
                         "printed).")


def run(settings: PlanCostSettings) -> None:
    """Time the plan at every row count and print the table and the machine."""
    print("| rows in the pass | 4 | 16 | 32 | 64 |\n|---|---|---|---|---|")
    print("| plan ms per step | " + " | ".join(f"{plan_ms(n, settings.repeats):.2f}"
                                              for n in (4, 16, 32, 64)) + " |")
    print(machine())


if __name__ == "__main__":
    settings_command(PlanCostSettings, run)()
