"""The server's handle on a runner process: spawning it (``process.py``), the
client side of the wire protocol, a serving runner (``proxy.py``), what it is
launched with (``launch.py``), device probing and load progress. Of the runner
package it imports only ``jupyter_llm.runner.protocol``."""
