"""Deliberately wrong (and deliberately different but correct) implementations for the tests."""
