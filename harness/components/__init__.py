"""Component definitions. Importing this package registers every component.

One module per family; each defines its components with `registry.register(Component(...))`:
the input builder, the reference call and the comparison kind of every output.
"""

from . import numeric, rope  # noqa: F401

_OPTIONAL = (
    "topk",
    "compressor",
    "kv",
    "indexer",
    "addressing",
    "attention",
    "attention_steps",
    "sparse_attn",
    "topology",
)
for _name in _OPTIONAL:
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:  # a family whose module is not written yet
        if _exc.name != f"{__name__}.{_name}":
            raise
