"""The candidate blocks' chain: the keep mask follows the verdict of the blocks it is made of.

`candidates.select` reports the kept block ids (`blocks`, derived by the harness from the returned
mask and judged as an index output against the ranked block scores: exact, tie order, near tie or
miss) and the mask itself. The mask is nothing but the rows of those blocks, so where the blocks
differ from the golden's, the mask is judged given them: the rows of your blocks, exactly. A
tie-order difference in the blocks is then one difference, reported and accepted (or refused)
once, by the blocks' policy; a mask that is not whole blocks, or whose blocks miss, still fails.
"""

from __future__ import annotations

import torch

from ..policy import Policy
from .stages import ChainJudgement, Judge, StageVerdict, attribute_problem


def rows_of_blocks(blocks: torch.Tensor, width: int, block_size: int) -> torch.Tensor:
    """bool [..., width]: the rows of the valid block ids of `blocks` (int [..., nb], -1 = none)."""
    nb = -(-width // block_size)
    valid = (blocks >= 0) & (blocks < nb)
    keep = torch.zeros((*blocks.shape[:-1], nb + 1), dtype=torch.bool)
    keep.scatter_(-1, torch.where(valid, blocks.long(), nb), True)  # invalid lanes land in a spare column
    return keep[..., :nb].repeat_interleave(block_size, dim=-1)[..., :width]


def judge_candidates(
    inputs: dict, golden: dict, aux: dict, actual: dict, params: dict, judge: Judge, boundary: Policy
) -> ChainJudgement:
    result = ChainJudgement()
    blocks = StageVerdict("blocks", judge("blocks", golden["blocks"], actual.get("blocks"), {}))
    mask, want = actual.get("mask"), golden["mask"]
    verdict = judge("mask", want, mask, {})
    stage = StageVerdict("mask", verdict)
    if not verdict.ok and blocks.explained and not attribute_problem(mask, want.dtype, tuple(want.shape)):
        given = rows_of_blocks(actual["blocks"], want.shape[-1], int(params["block_size"]))
        stage = StageVerdict(
            "mask", judge("mask", given, mask, {}), given=("blocks",), rederived_rows=int((given != want).any(-1).sum())
        )
    result.verdicts += [blocks, stage]
    return result
