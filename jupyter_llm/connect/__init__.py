"""The client side of jupyter-llm, shared by ``jupyter llm`` (``cli``) and the
kernel (``kernel``), which import it and never each other.

- ``endpoint``: ``ServerEndpoint``, the HTTP address and token of a server, and
  ``LLMClientError``;
- ``discovery``: ``find_server``, which server to use (or an embedded one);
- ``embedded``: the extension served from a thread of this process;
- ``labels`` and ``views``: how the API's answers read to a person;
- ``loading``: a model's load progress and slots from ``/api/ps``, and the
  ``LoadWatcher`` that shows it until the first token;
- ``create``: creating a model from a local Modelfile or GGUF.
- ``origin``: the kernel and cell headers a kernel's requests carry.
"""

from jupyter_llm.connect.discovery import SeveralServersError, find_server
from jupyter_llm.connect.endpoint import LLMClientError, ServerEndpoint

__all__ = ["LLMClientError", "ServerEndpoint", "SeveralServersError", "find_server"]
