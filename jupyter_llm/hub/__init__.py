"""The engine as a JupyterHub-managed service (``jupyter llm serve``): one
scheduler for every user of the Hub, authenticated with the Hub's OAuth tokens
and scopes. Needs the ``jupyterhub`` package (``pip install jupyter-llm[hub]``)."""
