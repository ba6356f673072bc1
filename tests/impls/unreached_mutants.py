"""Mutants of the reference at behaviours the goldens of issue 35 were added to reach: each is the
reference with one source line changed, so it differs from it only where that line matters.

- `SingleRowSkipped`: `indexer_forward` treats an index step that sees one compressed row (T == 1)
  like one that sees none (T == 0), skipping the indexer: no compressed ids.
- `SinglePickSqueezed`: `select_topk` squeezes its lane dimension away when it keeps a single row
  (k = min(index_topk, T) = 1, i.e. T == 1 for the tiny config's index_topk 4): ids [b, S].
- `LastRowClamped`: `restore_candidates` (mask form) clamps compact ids to W - 2 instead of W - 1,
  an off-by-one that only a compact id on the mask's last row (c == W - 1) can show.

tests/test_unreached_behaviours.py runs them against the new goldens and the older ones.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from types import FunctionType, ModuleType

import v41_conformance.reference.attention as ref_attention
from v41_conformance.adapters.reference import ReferenceAdapter
from v41_conformance.reference import candidates as cd
from v41_conformance.reference import indexer as ix
from patching import patched

# (module, function, the reference's line as written, the mutant's line)
SKIP_LINE = (ix, "indexer_forward", "if T == 0:", "if T <= 1:")
SQUEEZE_LINE = (
    ix,
    "select_topk",
    "ids = torch.where(picked < lens, picked + offset, -1).to(torch.int32)",
    "ids = torch.where(picked < lens, picked + offset, -1).to(torch.int32).squeeze(-1)",
)
CLAMP_LINE = (
    cd,
    "restore_candidates",
    "rows.gather(-1, c.clamp(max=max(kept.shape[-1] - 1, 0)))",
    "rows.gather(-1, c.clamp(max=max(kept.shape[-1] - 2, 0)))",
)


def mutated(module: ModuleType, name: str, line: str, replacement: str) -> FunctionType:
    """`module.name` recompiled with `line` (which must occur exactly once in its source) replaced.

    The mutant shares the module's globals, so it calls the module's other functions as the
    reference does (and sees their patches)."""
    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    if source.count(line) != 1:
        raise AssertionError(
            f"{module.__name__}.{name}: expected the line {line!r} exactly once; "
            "the reference changed, update the mutant"
        )
    code = compile(
        source.replace(line, replacement),
        inspect.getsourcefile(module),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    scope: dict = {}
    exec(code, vars(module), scope)  # noqa: S102 - the reference's own source, one line changed
    return scope[name]


class SingleRowSkipped(ReferenceAdapter):
    """T == 1 treated as T == 0: the indexer is skipped and no compressed row is selected.

    Reaches the `attention` component (its index sources use `indexer_forward`'s ids). The
    `indexer` component re-derives its ids from the scores with `select_with_leak`, so there the
    mutated line changes nothing."""

    def run(self, component, inputs, params):
        forward = mutated(*SKIP_LINE)
        with patched(ix, "indexer_forward", forward), patched(ref_attention, "indexer_forward", forward):
            return super().run(component, inputs, params)


class SinglePickSqueezed(ReferenceAdapter):
    """A selection of one lane per query loses its lane dimension (`.squeeze(-1)`)."""

    def run(self, component, inputs, params):
        with patched(ix, "select_topk", mutated(*SQUEEZE_LINE)):
            return super().run(component, inputs, params)


class LastRowClamped(ReferenceAdapter):
    """Mask-form compact ids clamped to W - 2: compact id W - 1 (all rows kept) reads row W - 2."""

    def run(self, component, inputs, params):
        with patched(cd, "restore_candidates", mutated(*CLAMP_LINE)):
            return super().run(component, inputs, params)


MUTANTS = (SingleRowSkipped, SinglePickSqueezed, LastRowClamped)
