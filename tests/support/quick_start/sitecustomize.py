"""Put on PYTHONPATH of a test's Jupyter server (``LiveServer``): jsonschema's
format checker imports ``rfc3987_syntax`` if it can, and that builds an
Earley grammar for IRIs at import, 1.7 s of CPU in every Jupyter server
started (jupyter_events imports jsonschema). None of our tests validates an
IRI, so their servers go without it; a user's server keeps it."""

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # ``import`` raises ImportError
