"""Helpers shared by the tests: real models, the numpy test backend, process statistics."""
