"""Diagnosis of failing cases: which known porting bugs the implementation's outputs pass under."""

from .diagnose import Diagnosis, Match, Rejudged, diagnose
from .variants import VARIANTS, Variant

__all__ = ["Diagnosis", "Match", "Rejudged", "VARIANTS", "Variant", "diagnose"]
