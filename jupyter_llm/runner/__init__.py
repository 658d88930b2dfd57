"""The runner process: ``python -m jupyter_llm.runner`` serves one model over the
wire protocol in ``protocol.py``, the only module the server side shares."""
