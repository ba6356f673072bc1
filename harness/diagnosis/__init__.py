"""Diagnosis of failing cases: which known porting bug reproduces what the implementation returned."""

from .diagnose import Diagnosis, Match, diagnose
from .variants import VARIANTS, Variant

__all__ = ["Diagnosis", "Match", "VARIANTS", "Variant", "diagnose"]
