"""Builders and fixtures shared between test files.

A test file imports what it shares from here, never from another test file: a test file can
then be moved, split or deleted without breaking the others.
"""
