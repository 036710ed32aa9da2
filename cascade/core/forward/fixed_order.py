"""Fixed-order kernels: weight products and attention whose rows never depend on one another.

The batch-invariant pass needs every weight product to give a row the same bits whatever the
row count. The CPU libraries torch calls choose their kernels and their reduction orders by the
row count (MKL: a vector kernel for one row, others for 2-15 and 16+), so the pass ran on
oneDNN's blocked products, the only ones that keep a row's bits at every count, and paid for
it at one row, where oneDNN is slower than MKL's vector kernel. The kernel here
(``fixed_order.cpp``, AVX2 + FMA) sums every output in one fused multiply-add chain over
the inner dimension in index order, so it is invariant by construction, and it streams a
weight packed into panels of 16 columns once per call, so one row runs at about the memory's
read bandwidth. bfloat16 weights and inputs are widened to float32 in registers (each output
rounded once), which gives a CPU without bfloat16 instructions (AVX2 only) packed bfloat16
products at half the weight bytes.

The attention kernel does for the invariant pass's attention what the products do for its
weights: each query's scores, softmax and weighted sum of values run over its own visible keys
in slot order, read in place from the paged store (no gather), so a query's numbers depend on
its keys alone, not on the other queries, their spans or any padding.

The kernel is compiled once per machine (about half a minute; ``python -m
cascade.core.forward.fixed_order`` does it ahead, as the install script and the CPU image do)
into ``CASCADE_KERNEL_DIR`` (default ``~/.cache/cascade/kernels``) and loaded from there after.
Where it cannot be had (no AVX2, no compiler, ``CASCADE_FIXED_ORDER=0``) ``available`` is False
and packed weights stay on oneDNN (``cascade.core.forward.packed_weights``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PANEL = 16
"""Output columns per panel of a packed weight."""
SOURCE = Path(__file__).with_name("fixed_order.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]


def available() -> bool:
    """Whether fixed-order products run here (the kernel is built on the first call)."""
    return _load()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A float32 or bfloat16 [out, in] weight as panels [ceil(out / 16), in, 16] (zero
    columns pad the last panel)."""
    _require()
    out, width = weight.shape
    padded = weight.new_zeros(-(-out // PANEL) * PANEL, width)
    padded[:out] = weight
    return padded.view(-1, PANEL, width).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, out: int) -> torch.Tensor:
    """The [out, in] weight ``pack`` was given."""
    return packed.transpose(1, 2).reshape(-1, packed.shape[1])[:out].contiguous()


def product(x: torch.Tensor, packed: torch.Tensor, out: int,
            bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ W.T (+ bias) -> [..., out] for W packed by ``pack``."""
    return torch.ops.cascade_fixed_order.linear(x, packed, out, bias)


@dataclass(frozen=True)
class AttentionPlan:
    """The invariant pass's query groups for ``attention``: every query over its own group's
    slots, no buckets, no padding."""

    slots: torch.Tensor
    """The groups' slots, one group after another."""
    group_start: torch.Tensor
    """[groups + 1] where each group's slots begin (and the end)."""
    query_rows: torch.Tensor
    """The packed row of each query ..."""
    query_group: torch.Tensor
    """... its group ..."""
    mask: torch.Tensor
    """... its visible slots (bool, its group's length), one query after another ..."""
    mask_start: torch.Tensor
    """... and where its mask begins."""

    @classmethod
    def of(cls, members: list) -> AttentionPlan:
        """From ``cascade.core.forward.invariant.Group``s."""
        _require()
        starts, rows, groups, masks, mask_starts, at = [0], [], [], [], [], 0
        for g, group in enumerate(members):
            starts.append(starts[-1] + len(group.slots))
            rows += group.rows
            groups += [g] * len(group.rows)
            masks.append(group.visible.reshape(-1))
            mask_starts += range(at, at + group.visible.numel(), len(group.slots))
            at += group.visible.numel()
        return cls(torch.tensor([s for g in members for s in g.slots], dtype=torch.long),
                   torch.tensor(starts), torch.tensor(rows, dtype=torch.long),
                   torch.tensor(groups, dtype=torch.long),
                   torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool),
                   torch.tensor(mask_starts, dtype=torch.long))


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan,
              scaling: float, softcap: float | None) -> torch.Tensor:
    """query [heads, N, d] (float32) over ``plan``'s key slots of keys/values [kv_heads,
    slots, d] (float32 or bfloat16) -> [heads, N, d] float32; each query over its visible
    keys alone, in slot order (rows the plan does not answer are zero).
    """
    return torch.ops.cascade_fixed_order.attention(
        query, keys, values, plan.slots, plan.group_start, plan.query_rows, plan.query_group,
        plan.mask, plan.mask_start, scaling, softcap)


def _require() -> None:
    if not _load():
        raise RuntimeError("fixed-order kernels are unavailable here (see the log for why; "
                           "CASCADE_FIXED_ORDER=0 turns them off)")


def kernel_dir() -> Path:
    return Path(os.environ.get("CASCADE_KERNEL_DIR")
                or Path.home() / ".cache" / "cascade" / "kernels")


def _name() -> str:
    """The build's name: changes with the source, the flags and torch's version."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join(FLAGS + [torch.__version__]).encode())
    return f"cascade_fixed_order_{digest.hexdigest()[:12]}"


def _supported() -> bool:
    return (os.environ.get("CASCADE_FIXED_ORDER", "1") != "0"
            and platform.machine() in ("x86_64", "AMD64")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


@functools.cache
def _load() -> bool:
    if not _supported():
        return False
    try:
        name = _name()
        built = kernel_dir() / name / f"{name}.so"
        if built.exists():
            torch.ops.load_library(str(built))
        else:
            _build(name, built.parent)
    except Exception as error:  # no compiler, no ninja, a failed build: oneDNN instead
        log.warning("fixed-order products unavailable (%s): packed weights use oneDNN",
                    str(error).strip().splitlines()[-1] if str(error).strip() else error)
        return False
    torch.library.register_fake("cascade_fixed_order::linear")(_fake_linear)
    torch.library.register_fake("cascade_fixed_order::attention")(_fake_attention)
    return True


def _build(name: str, directory: Path) -> None:
    from torch.utils import cpp_extension

    log.warning("building the fixed-order product kernel into %s (once per machine, about "
                "half a minute)", directory)
    directory.mkdir(parents=True, exist_ok=True)
    # ninja (a dependency of the models extra) sits beside this interpreter
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    cpp_extension.load(name, [str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                       build_directory=str(directory), is_python_module=False)


def _fake_linear(x, packed, out, bias):
    return x.new_empty(*x.shape[:-1], out)


def _fake_attention(query, *args):
    return torch.empty_like(query)


def main() -> int:
    """Build (or find) the kernel ahead of use; exit 1 where a CPU that can run it failed to
    build it."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not available():
        print("fixed-order products unavailable here: packed weights use oneDNN")
        return 1 if _supported() else 0
    print(f"fixed-order product kernel ready in {kernel_dir() / _name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
