"""Grammars for constrained generation, in GBNF (llama.cpp's grammar language):
pure functions, shared by the API (``format``, ``response_format``) and the
runner's tool-call grammars.

``json_schema`` converts a JSON Schema, ``regex`` a ``pattern``, ``numbers``
a numeric range; ``gbnf`` holds the grammar text they write and the budget
that bounds it.
"""
