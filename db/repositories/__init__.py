"""Repositories: functions over a caller's ``Session`` that add and flush but never commit.

Inputs are plain dataclasses (or dicts with the same fields); outputs are ORM rows or small frozen dataclasses.
"""
