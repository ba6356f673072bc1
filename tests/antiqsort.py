"""McIlroy's quicksort adversary for the top-k tests: re-exported from `v41_conformance.reference.topk_adversary`."""

from __future__ import annotations

from v41_conformance.reference.topk_adversary import antiqsort_keys, antiqsort_values

__all__ = ["antiqsort_keys", "antiqsort_values"]
