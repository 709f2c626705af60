"""Helpers the test modules share: configs, fakes, command lines, run directories.

Test modules import from here (and from the other helper modules beside them), never from
another test module: tests/test_suite_layout.py checks that.
"""
