"""Kernel side: the ``%%llm``/``%llm`` magics (``magics``), what they return
(``results``) and the ``DeviceDashboard`` widget (``widgets``). Finding and
talking to the server is ``jupyter_llm.connect``, shared with the CLI."""
