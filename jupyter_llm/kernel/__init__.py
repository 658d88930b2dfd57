"""Kernel side: the ``%%llm``/``%llm`` magics (``magics``), what they return
(``results``), ``jupyter_llm.map`` (``batch``), structured output shared by
both (``formats``) and the ``DeviceDashboard`` widget (``widgets``). Finding
and talking to the server is ``jupyter_llm.connect``, shared with the CLI."""
