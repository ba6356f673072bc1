"""Verdicts along the chain: each output judged given the implementation's own inputs to the last
quantisation or selection decision before it (docs/verdicts.md, "The chain").

- `digest`: the row digests a golden keeps of the reference's intermediates it does not store;
- `stages`: judging one stage (its rows that differ rederived from the given inputs), what a stage
  passes downstream, and the chain's verdicts in order;
- `attention`, `indexer`: the stages of those components and the reference re-run from them.
"""
