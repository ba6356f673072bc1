"""Implementations with shape-dependent bugs that every frozen golden misses (tests/test_fuzz.py):
`conformance fuzz` has to find, shrink and promote them."""

from __future__ import annotations


from v41_conformance.adapters.reference import ReferenceAdapter

TILE = 64


class DropsLanesPastFourTiles(ReferenceAdapter):
    """sparse_attn reads index lanes in tiles of 64, but only four tiles: lanes 256 and up are
    never read (frozen cases have at most 150 lanes)."""

    def run(self, component, inputs, params):
        if component == "sparse_attn" and inputs["topk_idxs"].shape[-1] > 4 * TILE:
            ids = inputs["topk_idxs"].clone()
            ids[..., 4 * TILE :] = -1
            inputs = {**inputs, "topk_idxs": ids}
        return super().run(component, inputs, params)


class WindowPositions16Bit(ReferenceAdapter):
    """window.indices keeps the start position in 16 bits: past 2^16 it wraps (frozen cases
    start before 1,100)."""

    def run(self, component, inputs, params):
        if component == "window.indices" and "start" in params:
            params = {**params, "start": int(params["start"]) % (1 << 16)}
        return super().run(component, inputs, params)


class CompressorBatchOf3(ReferenceAdapter):
    """The compressor launches its grid for batches of 1, 2 or 4: with 3 sequences, the third
    reads the second's input (frozen cases use batches of 1 and 2)."""

    def run(self, component, inputs, params):
        if component == "compressor" and inputs["x"].shape[0] == 3:
            x = inputs["x"].clone()
            x[2] = x[1]
            inputs = {**inputs, "x": x}
        return super().run(component, inputs, params)
