"""Embedded local services for ``make demo`` and the tests: a Ray head and a COS stand-in, on 127.0.0.1.

Nothing here is used against a real cluster; production points the connections elsewhere.
"""
