"""Row digests of tensors the golden does not hold (the reference's intermediates).

A golden keeps, per intermediate of each call, one 64-bit digest (SHA-256, truncated) of the whole tensor's bytes
followed by one per row (the flattened leading dims): `[1 + rows]` int64. Judging compares the
implementation's value with it: the whole digest settles the common case (nothing differs) in one
hash; otherwise the row digests name the rows to rederive. Bytes are the tensor's own bit patterns,
so -0 and +0 differ (a row that differs only by the sign of a zero is rederived and then judged by
its policy, not skipped).
"""

from __future__ import annotations

import hashlib

import torch

from ..tensorbytes import tensor_bytes

DIGEST_BYTES = 8
CASE_DIGEST = "case.digest"  # aux name of `case_digest` of the reference's outputs and intermediates


def _hash(data) -> int:
    # SHA-256 because CPUs hash it in hardware (several times BLAKE2b's speed here); 64 bits suffice.
    return int.from_bytes(hashlib.sha256(data).digest()[:DIGEST_BYTES], "little", signed=True)


def _bytes_by_row(t: torch.Tensor, lead: int):
    rows = 1
    for n in t.shape[:lead]:
        rows *= int(n)
    flat = t.detach().cpu().contiguous().reshape(rows, -1)
    return rows, flat.view(torch.uint8).numpy() if flat.numel() else None


def digests(t: torch.Tensor, lead: int) -> torch.Tensor:
    """int64 [1 + rows]: the whole tensor's digest, then one per row of its first `lead` dims."""
    rows, data = _bytes_by_row(t, lead)
    if data is None:
        return torch.zeros(1 + rows, dtype=torch.int64)
    out = [_hash(data)] + [_hash(data[r]) for r in range(rows)]
    return torch.tensor(out, dtype=torch.int64)


def differing_rows(actual: torch.Tensor, stored: torch.Tensor, lead: int) -> torch.Tensor:
    """bool [rows]: the rows of `actual` (same dtype and shape as the reference's) whose bytes differ
    from the reference's, by the stored digests; all False when the whole digest matches."""
    rows, data = _bytes_by_row(actual, lead)
    if data is None or _hash(data) == int(stored[0]):
        return torch.zeros(rows, dtype=torch.bool)
    mine = torch.tensor([_hash(data[r]) for r in range(rows)], dtype=torch.int64)
    return mine != stored[1:]


def case_digest(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """int64 [1]: one digest of a case's outputs and intermediates (name, dtype, shape and bytes of
    each, by name): equal for an implementation that reproduces the reference exactly, which then
    passes without a stage being rederived."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{list(t.shape)};".encode())
        if t.numel():
            h.update(tensor_bytes(t))
    return torch.tensor([int.from_bytes(h.digest()[:DIGEST_BYTES], "little", signed=True)], dtype=torch.int64)
