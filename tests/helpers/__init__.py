"""Helpers shared by test folders (not tests themselves): fixtures' builders, run drivers, worker
scripts started by path, callbacks named by class path in commands."""
